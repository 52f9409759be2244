// Where one core's time goes in the CPU attention kernel's MLA path (csrc/attn_amx.cpp, C layout,
// 16 heads, 576-value rows, V the first 512): its Q.K on token-major copies and its P.V, over
// 12 groups of 32 tokens (16 pair rows 2304 bytes apart each, 432 KB: they stay in L2), timed
// as the kernel runs them and with one part at a time taken out or changed. Alone on vCPU 0,
// then on every vCPU at once (each thread its own data). Prints ns per 32-token group.
//
// The sixteenth-to-eighteenth sessions' phase counters (bench.cpu_phases) gave about 1100 ns a
// group for each of Q.K and P.V on one core in L2, where l2_to_l1.c's strided tile load plus
// one product took 13.6 ns from L2 and 7.4 ns from L1 (twentieth session): 32 such pairs are
// 240-440 ns. The variants say which part of the schedule costs the rest.
//
// Build and run (an AMX CPU, Linux): gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f
//   -mavx512bw amx_mla_pass.c -o mlapass && ./mlapass
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mb_common.h"

#define RS 2304          // bytes between pair rows (576 values x 2 tokens x 2 bytes)
#define NG 12            // groups in the window
#define GB (16 * RS)     // bytes of one group
#define NKT 18           // Q.K steps of 32 values
#define NDV 32           // P.V's 16-value column tiles

enum {  // variants
    PV_KERNEL, PV_NOPF, PV_P2, PV_V3, PV_NOV, PV_NODP, PV_NOO,
    QK_KERNEL, QK_NOPF, QK_NOCOPY, QK_COPYONLY, QK_B2, QK_NOPF_NOCOPY, NVAR
};
static const char* NAMES[NVAR] = {
    "P.V as the kernel (V prefetched into L1 a group ahead)", "P.V without the L1 prefetch",
    "P.V, P in tiles 4 and 5 in turn", "P.V, V in tiles 5, 6, 7 in turn",
    "P.V without V tile loads (products on loaded tiles)", "P.V without products (tile loads only)",
    "P.V without O's tile loads and stores",
    "Q.K as the kernel (copy, 4 products, L1 prefetch)", "Q.K without the L1 prefetch",
    "Q.K without the copy (tiles from a fixed copy)", "Q.K copy and prefetch only (no tiles)",
    "Q.K, B in tiles 6 and 7 in turn", "Q.K without copy or prefetch"};

struct bufs { char* pool; uint16_t* pa; float* o; uint16_t* kt; uint16_t* bq; float* s; };

static inline void pf_group(const char* g, int dn) {  // a group's 64 V lines of column tiles dn..dn+3
    for (int r = 0; r < 16; r++)
        for (int l = 0; l < 4; l++) _mm_prefetch(g + (long)r * RS + 128 * dn + 64 * l, _MM_HINT_T0);
}

// P.V over the window: per 4 column tiles, per group: P (A, tile 4), four V tiles (B), four products
static void pv(const struct bufs* b, int v) {
    for (int dc0 = 0; dc0 < NDV; dc0 += 4) {
        float* o0 = b->o + 16 * dc0;
        if (v != PV_NOO) {
            _tile_loadd(0, o0, 2048); _tile_loadd(1, o0 + 16, 2048);
            _tile_loadd(2, o0 + 32, 2048); _tile_loadd(3, o0 + 48, 2048);
        }
        if (v == PV_NOV) { _tile_loadd(6, b->pool + 128 * dc0, RS); _tile_loadd(7, b->pool + 128 * dc0 + 64, RS); }
        for (int g = 0; g < NG; g++) {
            const char* vp = b->pool + (long)g * GB + 128 * dc0;
            const uint16_t* p = b->pa + g * 512;
            if (v == PV_P2 && (g & 1)) {
                _tile_loadd(5, p, 64);
                _tile_loadd(6, vp, RS); _tile_dpbf16ps(0, 5, 6);
                _tile_loadd(7, vp + 64, RS); _tile_dpbf16ps(1, 5, 7);
                _tile_loadd(6, vp + 128, RS); _tile_dpbf16ps(2, 5, 6);
                _tile_loadd(7, vp + 192, RS); _tile_dpbf16ps(3, 5, 7);
            } else if (v == PV_V3) {  // product k of the pass uses V tile 5 + k % 3
                _tile_loadd(4, p, 64);
                switch (g % 3) {
                case 0:
                    _tile_loadd(5, vp, RS); _tile_dpbf16ps(0, 4, 5); _tile_loadd(6, vp + 64, RS); _tile_dpbf16ps(1, 4, 6);
                    _tile_loadd(7, vp + 128, RS); _tile_dpbf16ps(2, 4, 7); _tile_loadd(5, vp + 192, RS); _tile_dpbf16ps(3, 4, 5);
                    break;
                case 1:
                    _tile_loadd(6, vp, RS); _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, vp + 64, RS); _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, vp + 128, RS); _tile_dpbf16ps(2, 4, 5); _tile_loadd(6, vp + 192, RS); _tile_dpbf16ps(3, 4, 6);
                    break;
                default:
                    _tile_loadd(7, vp, RS); _tile_dpbf16ps(0, 4, 7); _tile_loadd(5, vp + 64, RS); _tile_dpbf16ps(1, 4, 5);
                    _tile_loadd(6, vp + 128, RS); _tile_dpbf16ps(2, 4, 6); _tile_loadd(7, vp + 192, RS); _tile_dpbf16ps(3, 4, 7);
                }
            } else if (v == PV_NOV) {
                _tile_loadd(4, p, 64);
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 4, 6); _tile_dpbf16ps(3, 4, 7);
            } else if (v == PV_NODP) {
                _tile_loadd(4, p, 64);
                _tile_loadd(6, vp, RS); _tile_loadd(7, vp + 64, RS); _tile_loadd(6, vp + 128, RS); _tile_loadd(7, vp + 192, RS);
            } else {
                _tile_loadd(4, p, 64);
                _tile_loadd(6, vp, RS); _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, vp + 64, RS); _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(6, vp + 128, RS); _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(7, vp + 192, RS); _tile_dpbf16ps(3, 4, 7);
            }
            if (v != PV_NOPF) {  // the next group's lines of these column tiles (or the first group's next ones)
                int gn = g + 1, dn = dc0;
                if (gn == NG) { gn = 0; dn += 4; }
                if (dn < NDV) pf_group(b->pool + (long)gn * GB, dn);
            }
        }
        if (v != PV_NOO) {
            _tile_stored(0, o0, 2048); _tile_stored(1, o0 + 16, 2048);
            _tile_stored(2, o0 + 32, 2048); _tile_stored(3, o0 + 48, 2048);
            __asm__ volatile("" ::: "memory");
        }
    }
}

// Q.K over the window: per pair of groups, per 32-value step: the step's 128 bytes of each pair
// row of both groups split into the two tokens' rows (4 KB, two buffers), B (q) and four A tiles
static void qk(const struct bufs* b, int v) {
    const __m512i iev = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i iod = _mm512_add_epi16(iev, _mm512_set1_epi16(1));
    const int copy = v != QK_NOCOPY && v != QK_NOPF_NOCOPY, tiles = v != QK_COPYONLY;
    const int pf = v != QK_NOPF && v != QK_NOPF_NOCOPY;
    for (int g0 = 0; g0 < NG; g0 += 2) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int dc = 0; dc < NKT; dc++) {
            uint16_t* kt = b->kt + (dc & 1) * 2048;
            if (copy) {
                __asm__ volatile("" ::: "memory");
                for (int g = 0; g < 2; g++) {
                    const char* src = b->pool + (long)(g0 + g) * GB + 64 * dc;
                    for (int p = 0; p < 16; p++) {
                        const __m512i x = _mm512_loadu_si512(src + (long)p * RS), y = _mm512_loadu_si512(src + (long)p * RS + 64);
                        uint16_t* dst = kt + (2 * g + (p >> 3)) * 512 + 64 * (p & 7);
                        _mm512_store_si512(dst, _mm512_permutex2var_epi16(x, iev, y));
                        _mm512_store_si512(dst + 32, _mm512_permutex2var_epi16(x, iod, y));
                    }
                }
                __asm__ volatile("" ::: "memory");
            }
            if (tiles && v == QK_B2 && (dc & 1)) {
                _tile_loadd(7, b->bq + dc * 512, 64);
                _tile_loadd(4, kt, 64); _tile_dpbf16ps(0, 4, 7);
                _tile_loadd(5, kt + 512, 64); _tile_dpbf16ps(1, 5, 7);
                _tile_loadd(4, kt + 1024, 64); _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, kt + 1536, 64); _tile_dpbf16ps(3, 5, 7);
            } else if (tiles) {
                _tile_loadd(6, b->bq + dc * 512, 64);
                _tile_loadd(4, kt, 64); _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(5, kt + 512, 64); _tile_dpbf16ps(1, 5, 6);
                _tile_loadd(4, kt + 1024, 64); _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(5, kt + 1536, 64); _tile_dpbf16ps(3, 5, 6);
            }
            if (pf) {  // the next step's lines (or the next pair's first), L2 -> L1
                int gn = g0, dn = dc + 1;
                if (dn == NKT) { gn = (g0 + 2) % NG; dn = 0; }
                for (int g = gn; g < gn + 2; g++)
                    for (int p = 0; p < 16; p++) {
                        const char* q = b->pool + (long)g * GB + (long)p * RS + 128 * dn;
                        _mm_prefetch(q, _MM_HINT_T0); _mm_prefetch(q + 64, _MM_HINT_T0);
                    }
            }
        }
        if (tiles) {
            float* sg = b->s + g0 * 512;
            _tile_stored(0, sg, 64); _tile_stored(1, sg + 256, 64); _tile_stored(2, sg + 512, 64); _tile_stored(3, sg + 768, 64);
            __asm__ volatile("" ::: "memory");
        }
    }
}

// job->variant: the schedule; value: ns per group
static void* run(void* arg) {
    struct mb_job* j = arg;
    pin(j->cpu);
    tiles_config();
    struct bufs b;
    b.pool = aligned_alloc(4096, (size_t)NG * GB + 4096);
    b.pa = aligned_alloc(64, NG * 1024);
    b.o = aligned_alloc(64, 16 * 512 * 4);
    b.kt = aligned_alloc(64, 8192);
    b.bq = aligned_alloc(64, NKT * 1024);
    b.s = aligned_alloc(64, NG * 2048);
    // small bf16 values everywhere (0x3C00 ~ 0.0078): no infinities in the accumulators
    for (size_t i = 0; i < (size_t)NG * GB / 2; i++) ((uint16_t*)b.pool)[i] = 0x3C00;
    for (int i = 0; i < NG * 512; i++) b.pa[i] = 0x3C00;
    for (int i = 0; i < NKT * 512; i++) b.bq[i] = 0x3C00;
    for (int i = 0; i < 4096; i++) b.kt[i] = 0x3C00;
    memset(b.o, 0, 16 * 512 * 4);
    const int v = j->variant, ispv = v < QK_KERNEL;
    for (int i = 0; i < 3; i++) ispv ? pv(&b, v) : qk(&b, v);  // warm: the window into L2
    if (j->bar) pthread_barrier_wait(j->bar);
    long passes = 0;
    double t = now();
    while (now() - t < j->secs) { for (int i = 0; i < 8; i++) ispv ? pv(&b, v) : qk(&b, v); passes += 8; }
    j->value = (now() - t) / passes / NG * 1e9;
    _tile_release();
    free(b.pool); free(b.pa); free(b.o); free(b.kt); free(b.bq); free(b.s);
    return NULL;
}

int main(void) {
    pin(0);
    printf("clock from dependent adds: %.2f GHz; %d vCPUs\n", mb_ghz(), (int)sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-56s %12s %22s\n", "ns per 32-token group (MLA, window in L2)", "1 vCPU", "all vCPUs: mean, range");
    for (int rep = 0; rep < 2; rep++)
        for (int v = 0; v < NVAR; v++) {
            const struct mb_spread r = mb_one_then_all(run, v, 0, 0.25);
            printf("%-56s %12.0f %10.0f, %.0f-%.0f\n", NAMES[v], r.one, r.mean, r.lo, r.hi);
        }
    pin(0);
    printf("clock from dependent adds at the end: %.2f GHz\n", mb_ghz());
    return 0;
}
