// One core: does a software prefetch stream from DRAM slow AMX work whose data sits in L2?
// The work is the CPU kernel's MLA Q.K schedule (two 32-token groups of C-layout rows, 2304 B
// apart, 36 steps of two A tiles against two B tiles of 1 KB, four tile products per step) over
// a 256 KB window that stays in L2, with its 72 KB of B tiles. Beside it, k PREFETCHT1 per step
// walk a 2 GiB array that is read nowhere else. If the core could hold both in flight, the work
// would keep its rate until the stream reaches the core's DRAM rate; if they share the L1 miss
// buffers, the work slows as the stream grows and the two add up.
// First line: the tile unit's rate with no loads at all (4 chains of tile products).
// Build and run (an AMX CPU, Linux): gcc -O2 -mamx-tile -mamx-bf16 -mavx512f
//   amx_l2_beside_prefetch.c -o l2pf && ./l2pf
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct cfg_t { uint8_t palette, start_row, res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define FAR (2L << 30)
#define KV (256L << 10)
#define BQ (72L << 10)
#define ROW 2304L
#define STEPS 36

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { fprintf(stderr, "no AMX permission\n"); return 1; }
    struct cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
    char* kv = aligned_alloc(4096, KV); memset(kv, 0, KV);
    char* bq = aligned_alloc(4096, BQ); memset(bq, 0, BQ);
    char* far = aligned_alloc(1 << 21, FAR); memset(far, 1, FAR);
    const long group = 16 * ROW, pairs = KV / (2 * group);
    {   // the tile unit's own rate: four independent chains of tile products, no loads
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(4, bq, 64); _tile_loadd(5, bq + 1024, 64); _tile_loadd(6, bq + 2048, 64); _tile_loadd(7, bq + 3072, 64);
        const long n = 5000000;
        double t = now();
        for (long i = 0; i < n; i++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        printf("tile products alone: %5.2f ns each\n", (now() - t) / (4.0 * n) * 1e9);
    }
    const int ks[] = {0, 2, 4, 8, 16, 32};
    size_t fo = 0;
    double alone = 0;
    for (unsigned ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const int k = ks[ki];
        long tdp = 0, lines = 0;
        double t0 = now(), dt;
        do {
            for (long p = 0; p < pairs; p++) {
                const char* s0 = kv + 2 * p * group;
                const char* s1 = s0 + group;
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                for (int dc = 0; dc < STEPS; dc++) {
                    for (int l = 0; l < k; l++) { _mm_prefetch(far + fo, _MM_HINT_T1); fo = (fo + 64) % FAR; }
                    const char* b = bq + (2 * dc % (BQ / 1024)) * 1024;
                    _tile_loadd(6, b, 64);
                    _tile_loadd(7, b + 1024, 64);
                    _tile_loadd(4, s0 + 64 * dc, ROW); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, s1 + 64 * dc, ROW); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                }
                static float out[4][256] __attribute__((aligned(64)));
                _tile_stored(0, out[0], 64); _tile_stored(1, out[1], 64);
                _tile_stored(2, out[2], 64); _tile_stored(3, out[3], 64);
                tdp += 4 * STEPS;
                lines += (long)k * STEPS;
            }
            dt = now() - t0;
        } while (dt < 1.0);
        const double ns = dt / tdp * 1e9;
        if (k == 0) alone = ns;
        printf("prefetch %2d lines/step: %5.2f ns per tile product (%3.0f%% of the rate alone), stream %5.2f GB/s\n",
               k, ns, 100.0 * alone / ns, lines * 64.0 / dt / 1e9);
    }
    _tile_release();
    return 0;
}
