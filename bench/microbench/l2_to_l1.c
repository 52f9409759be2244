// How fast one core moves data from its L2 (and L1) into vector registers and AMX tiles, in the
// access patterns of the CPU attention kernel's MLA path (csrc/attn_amx.cpp): the token-major
// Q.K copy reads 128 bytes of each of 16 pair rows 2304 bytes apart per step (vector loads), and
// P.V loads V tiles whose 16 rows are 2304 bytes apart. Each pattern sweeps a window that fits
// L1 (36 KB) or L2 (504 KB), alone on vCPU 0 and then on every vCPU at once (each thread its own
// window). Prints GB/s and bytes per cycle (the clock from a chain of dependent adds).
// If the L2 windows move far fewer bytes a cycle than the L1 ones, a group's 68 KB of L2 reads
// (36 KB copied for Q.K, 32 KB of V for P.V) cost the kernel more than its 68 tile products.
// The nineteenth session's call 5 ran it before the last two patterns and the closing clock were
// added (bench/results/2026-12-02d-h200/call5).
// Build and run (an AMX CPU, Linux): gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f
//   l2_to_l1.c -o l2l1 && ./l2l1
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RS 2304  /* bytes between pair rows: 576 dims x 2 tokens x 2 bytes */
#include "mb_common.h"

enum { VEC_SEQ, VEC_ROWS, TILE_SEQ, TILE_ROWS, TILE_ROWS_DP, TILE_ROWS_DP3, PRODUCTS, NPAT };
static const char* NAMES[NPAT] = {"vector loads, sequential", "vector loads, 16 rows 2304 B apart",
                                  "tile loads, 1 KB contiguous", "tile loads, rows 2304 B apart",
                                  "tile loads 2304 B apart + 1 product each",
                                  "the same, A in 3 tiles in turn",
                                  "products alone (GB/s: 1 KB a product)"};

// bytes moved by one sweep of pattern p over a window of `w` bytes
static double sweep(int p, const char* b, long w) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    double bytes = 0;
    if (p == VEC_SEQ) {
        for (long o = 0; o < w; o += 256) {
            a0 = _mm512_add_epi32(a0, _mm512_load_si512(b + o));
            a1 = _mm512_add_epi32(a1, _mm512_load_si512(b + o + 64));
            a2 = _mm512_add_epi32(a2, _mm512_load_si512(b + o + 128));
            a3 = _mm512_add_epi32(a3, _mm512_load_si512(b + o + 192));
        }
        bytes = w;
    } else if (p == VEC_ROWS) {  // groups of 16 rows; per step 128 B of each row
        const long g = 16 * RS, ng = w / g;
        for (long k = 0; k < ng; k++)
            for (int s = 0; s < RS / 128; s++)
                for (int r = 0; r < 16; r++) {
                    const char* q = b + k * g + (long)r * RS + 128 * s;
                    a0 = _mm512_add_epi32(a0, _mm512_load_si512(q));
                    a1 = _mm512_add_epi32(a1, _mm512_load_si512(q + 64));
                }
        bytes = (double)ng * g;
    } else if (p == TILE_SEQ) {
        for (long o = 0; o + 4096 <= w; o += 4096) {
            _tile_loadd(4, b + o, 64); _tile_loadd(5, b + o + 1024, 64);
            _tile_loadd(6, b + o + 2048, 64); _tile_loadd(7, b + o + 3072, 64);
        }
        bytes = (double)(w / 4096) * 4096;
    } else if (p == PRODUCTS) {  // the rate of products fed by no loads (tiles 4-6 as loaded)
        for (long o = 0; o + 4096 <= w; o += 4096) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 5, 6); _tile_dpbf16ps(2, 4, 6); _tile_dpbf16ps(3, 5, 6);
        }
        bytes = (double)(w / 4096) * 4096;
    } else if (p == TILE_ROWS_DP3) {  // A rotates over tiles 4, 5, 7: each rewritten every third product
        const long g = 16 * RS, ng = w / g;
        for (long k = 0; k < ng; k++)
            for (int s = 0; s < RS / 64; s += 12) {
                const char* q = b + k * g + 64 * s;
                _tile_loadd(4, q, RS); _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(5, q + 64, RS); _tile_dpbf16ps(1, 5, 6);
                _tile_loadd(7, q + 128, RS); _tile_dpbf16ps(2, 7, 6);
                _tile_loadd(4, q + 192, RS); _tile_dpbf16ps(3, 4, 6);
                _tile_loadd(5, q + 256, RS); _tile_dpbf16ps(0, 5, 6);
                _tile_loadd(7, q + 320, RS); _tile_dpbf16ps(1, 7, 6);
                _tile_loadd(4, q + 384, RS); _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(5, q + 448, RS); _tile_dpbf16ps(3, 5, 6);
                _tile_loadd(7, q + 512, RS); _tile_dpbf16ps(0, 7, 6);
                _tile_loadd(4, q + 576, RS); _tile_dpbf16ps(1, 4, 6);
                _tile_loadd(5, q + 640, RS); _tile_dpbf16ps(2, 5, 6);
                _tile_loadd(7, q + 704, RS); _tile_dpbf16ps(3, 7, 6);
            }
        bytes = (double)ng * g;
    } else {  // rows 2304 apart: one tile = 64 B of 16 rows; 36 tiles per group of rows
        const long g = 16 * RS, ng = w / g;
        for (long k = 0; k < ng; k++)
            for (int s = 0; s < RS / 64; s += 4) {
                const char* q = b + k * g + 64 * s;
                _tile_loadd(4, q, RS); if (p == TILE_ROWS_DP) _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(5, q + 64, RS); if (p == TILE_ROWS_DP) _tile_dpbf16ps(1, 5, 6);
                _tile_loadd(4, q + 128, RS); if (p == TILE_ROWS_DP) _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(5, q + 192, RS); if (p == TILE_ROWS_DP) _tile_dpbf16ps(3, 5, 6);
            }
        bytes = (double)ng * g;
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
    volatile int sink = _mm512_reduce_add_epi32(s); (void)sink;
    return bytes;
}

// job->variant: the pattern, job->arg: the window's bytes; value: GB/s
static void* run(void* arg) {
    struct mb_job* j = arg;
    pin(j->cpu);
    tiles_config();
    char* buf = aligned_alloc(4096, j->arg + 4096);
    memset(buf, 1, j->arg + 4096);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
    for (int i = 0; i < 4; i++) sweep(j->variant, buf, j->arg);  // warm: the window into L1 / L2
    if (j->bar) pthread_barrier_wait(j->bar);
    double bytes = 0, t = now();
    while (now() - t < j->secs) for (int i = 0; i < 16; i++) bytes += sweep(j->variant, buf, j->arg);
    j->value = bytes / (now() - t) / 1e9;
    _tile_release();
    free(buf);
    return NULL;
}

int main(void) {
    const int n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    pin(0);
    const double f = mb_ghz();
    printf("clock from dependent adds: %.2f GHz; %d vCPUs\n", f, n);
    const long W[2] = {16L * RS, 16L * RS * 14};  // 36 KB (in a 48 KB L1), 504 KB (in a 2 MB L2)
    const char* WN[2] = {"L1", "L2"};
    printf("%-44s %4s %14s %14s\n", "pattern", "win", "1 vCPU GB/s", "all vCPUs GB/s each");
    for (int p = 0; p < NPAT; p++)
        for (int wi = 0; wi < 2; wi++) {
            const struct mb_spread r = mb_one_then_all(run, p, W[wi], 0.5);
            printf("%-44s %4s %7.1f (%4.1f B/c) %6.1f mean (%4.1f B/c), %.1f-%.1f\n", NAMES[p], WN[wi], r.one,
                   r.one / f, r.mean, r.mean / f, r.lo, r.hi);
        }
    // the vCPU may run slower at some moments than at others (a host shared below the VM): the
    // clock again, so a run whose two readings differ is known to be suspect
    pin(0);
    printf("clock from dependent adds at the end: %.2f GHz\n", mb_ghz());
    return 0;
}
