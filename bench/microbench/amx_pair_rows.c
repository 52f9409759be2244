#define _GNU_SOURCE
// The CPU attention kernel's GQA read pattern on one core and on every core (fifty-fifth
// session, issue 8 on the 2-core AMX dev VM): the C layout's pair rows of 1 KB (GQA 32/4/128:
// the K half 512 B, the V half 512 B), 16 rows a 32-token group. Two groups at a time, Q.K loads
// 16-row tiles 1 KB apart, 64 bytes a row, in 8 steps (four products a step), then P.V loads the
// V halves the same way (one product a tile), as csrc/attn_amx.cpp's decode path does; against
// the same tile loads over contiguous 1 KB tiles, with no software prefetch and with PREFETCHT1
// of the next 32-128 KB spread over the steps; XK = 2 adds two products a tile.
// Build and run (an AMX CPU, Linux): gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f -mavx512bw
//   amx_pair_rows.c -o pairrows && ./pairrows
// On the AMX dev VM (2026-12-05, two runs, GB/s, one core (both cores)): pair rows 14.8-15.6
// (28.6-29.9) without a prefetch, 14.5-15.1 (28.4-29.5) with; contiguous 15.3-16.3 (30.8-31.1)
// and 14.6-15.4 (28.8-29.6); with XK = 2: pair rows 12.3-12.5 (24.2-24.5) without, 13.9-14.5
// (27.3-28.1) with; contiguous 14.1-14.5 (27.8-28.0) and 14.1-14.8 (27.4-28.6). The pattern
// itself costs little; the kernel reads ~10 a core.
#include "mb_common.h"
#include <stdio.h>
#include <sys/mman.h>
#define SZ (1L << 30)
#define GR 16384
static char* buf; static int NT, PF, STRIDED, XK;
static inline void ld(int t, const char* p) { if (STRIDED) { if (t == 4) _tile_loadd(4, p, 1024); else _tile_loadd(5, p, 1024); } else { if (t == 4) _tile_loadd(4, p, 64); else _tile_loadd(5, p, 64); } }
static inline void pfl(const char* p, int n) { for (int l = 0; l < n; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T1); }
static void* fn(void* v) {
    struct mb_job* j = v; pin(j->cpu); tiles_config();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(6); _tile_zero(7);
    const long part = SZ / (j->bar ? NT : 1);
    char* base = buf + (j->bar ? part * j->cpu : 0);
    if (j->bar) pthread_barrier_wait(j->bar);
    const long dist = j->arg;  // bytes ahead for PF modes
    double best = 0;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now();
        for (long g = 0; g + 2 * GR <= part; g += 2 * GR) {
            const char* a = base + g; const char* b = a + GR;
            // strided addresses: row r of group at a + r*1024 + col; contiguous: tile k of the 32 KB at a + k*1024
            for (int dc = 0; dc < 8; dc++) {
                if (PF == 1 && g + dist + 2 * GR <= part) pfl(a + dist + dc * 4096, 64);  // 32 KB / 8 steps
                if (STRIDED) { ld(4, a + 64 * dc); ld(5, b + 64 * dc); } else { ld(4, a + 1024 * dc); ld(5, b + 1024 * dc); }
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                if (XK) { _tile_dpbf16ps(0, 6, 7); _tile_dpbf16ps(1, 6, 7); }
            }
            for (int h = 0; h < 2; h++) {
                const char* gp = h ? b : a;
                for (int jj = 0; jj < 8; jj++) {
                    if (STRIDED) ld(4, gp + 512 + 64 * jj); else ld(4, gp + 8192 + 1024 * jj);
                    if (jj & 1) _tile_dpbf16ps(1, 6, 4); else _tile_dpbf16ps(0, 6, 4);
                    if (XK) { _tile_dpbf16ps(0, 6, 7); _tile_dpbf16ps(1, 6, 7); }
                }
            }
        }
        double r = part / (now() - t0) / 1e9;
        if (r > best) best = r;
    }
    j->value = best; return NULL;
}
int main(int argc, char** argv) {
    NT = (int)sysconf(_SC_NPROCESSORS_ONLN);
    buf = aligned_alloc(1 << 21, SZ); madvise(buf, SZ, MADV_HUGEPAGE); memset(buf, 0, SZ);
    for (XK = 0; XK <= 2; XK += 2)
    for (STRIDED = 0; STRIDED < 2; STRIDED++) {
        printf("%s XK=%d:", STRIDED ? "strided   " : "contiguous", XK);
        PF = 0; struct mb_spread r = mb_one_then_all(fn, 0, 0, 0); printf(" nopf %5.1f (%5.1f)", r.one, r.mean * NT);
        long ds[] = {32768, 65536, 131072};
        for (int i = 0; i < 3; i++) { PF = 1; r = mb_one_then_all(fn, 0, ds[i], 0); printf(" pf%ldK %5.1f (%5.1f)", ds[i] / 1024, r.one, r.mean * NT); }
        printf("\n"); fflush(stdout);
    }
    return 0;
}
