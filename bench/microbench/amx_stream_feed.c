#define _GNU_SOURCE
// One core, then every core: a DRAM stream feeding AMX tile products (fifty-fifth session, issue
// 8 on the 2-core AMX dev VM). Each 1 KB of a 1 GiB array (2 MiB pages advised; NOHUGE=1: 4 KiB
// pages) is one tile load and K products into four independent C tiles, read
//   * as tiles in place (TILELOADD from DRAM), with no software prefetch or with PREFETCHT1 of the
//     lines d bytes ahead (16 a tile);
//   * staged: each 4 KB chunk copied a chunk or two ahead into an L1 ring with AVX-512 loads and
//     stores (out-of-order loads instead of prefetches), the tiles loaded from the ring;
// next to the products alone (from L1) and a plain vector read of the same array.
// Build and run (an AMX CPU, Linux): gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f -mavx512bw
//   amx_stream_feed.c -o feed && ./feed && NOHUGE=1 ./feed
// On the AMX dev VM (2026-12-05, GB/s of the array, one core / both cores):
//   * read alone 15.7-16.9 / 31.4-33.4; products alone at K = 4 / 8: 60 / 30 a core;
//   * K = 4: tiles in place 13.5-14.3 / 26.4-27.5, with the prefetch 0.5-2 KB ahead 17.5-20.4 /
//     34.5-38.9, 4-64 KB ahead 15.1-16.3 / 29.5-31.8; K = 8: 10.8-11.2 / 21.2-21.6, 0.5-2 KB ahead
//     16.2-18.0 / 31.2-33.9, 4-64 KB ahead 13.4-14.1 / 26.3-27.5. A near prefetch lets one core
//     hide most of the stream under its products; the staged copy does not help (10.5-13.7).
//     Not settled: a scratch build choosing the prefetch's hint at run time (a switch in the
//     loop) read K = 6 at 16 KB ahead 18.8-22.7 / 38.5-42.7 and at 512 B 15.3-16.4 / 31.2-34.6;
//   * 4 KiB pages cost the prefetched stream 16-23% (K = 4: 34.9 -> 30.1 on both cores; K = 8:
//     32.6 -> 26.6). The engine's C pool and the benches' arrays are advised 2 MiB pages
//     (hostmem.pageable_empty), and get them on this VM.
// The kernel's own pattern (1 KB pair rows read 64 bytes a row at a time, K and V halves in two
// sweeps) reads about as fast (amx_pair_rows.c: 12.3-15.6 a core); the AMX attention kernel
// reads ~10 a core from DRAM (bench.cpu_phases), so its loss is in its phases' order (the
// softmax and the score stores issue no reads), not in its loads' pattern.
#include "mb_common.h"
#include <stdio.h>
#include <sys/mman.h>
#define SZ (1L << 30)
#define CH 4096
static char* buf; static int K; static int NT;
static inline void work_tile(const char* p) {
    _tile_loadd(4, p, 64);
    for (int j = 0; j < K; j++) {
        switch (j & 3) { case 0: _tile_dpbf16ps(0, 4, 6); break; case 1: _tile_dpbf16ps(1, 4, 7); break;
                         case 2: _tile_dpbf16ps(2, 4, 6); break; default: _tile_dpbf16ps(3, 4, 7); }
    }
}
static void* fn(void* v) {
    struct mb_job* j = v; pin(j->cpu); tiles_config();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(6); _tile_zero(7);
    const long part = SZ / (j->bar ? NT : 1);
    char* base = buf + (j->bar ? part * j->cpu : 0);
    static __thread char ring[4][CH] __attribute__((aligned(64)));
    if (j->bar) pthread_barrier_wait(j->bar);
    const int mode = j->variant; const long d = j->arg;
    double best = 0; __m512i acc = _mm512_setzero_si512();
    for (int rep = 0; rep < 2; rep++) {
        double t = now();
        if (mode == 4) {  // read only
            for (long g = 0; g < part; g += 256) {
                const __m512i* q = (const __m512i*)(base + g);
                acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_add_epi32(q[0], q[1]), _mm512_add_epi32(q[2], q[3])));
            }
        } else if (mode == 5) {  // compute only (L1)
            for (long g = 0; g < part; g += 1024) work_tile(ring[0] + (g & (CH - 1)));
        } else if (mode == 0 || mode == 1) {  // tiles in place, optional prefetch d bytes ahead
            for (long g = 0; g < part; g += 1024) {
                if (mode == 1 && g + d + 1024 <= part)
                    for (int l = 0; l < 16; l++) _mm_prefetch(base + g + d + l * 64, _MM_HINT_T1);
                work_tile(base + g);
            }
        } else {  // staged: chunk c+d/CH copied during chunk c's work, ring of 4
            const int ah = (int)(d / CH);
            for (int c = 0; c < ah; c++) memcpy(ring[c & 3], base + (long)c * CH, CH);
            for (long c = 0; c * CH < part; c++) {
                const long nc = c + ah;
                char* dst = ring[nc & 3]; const char* src = base + nc * CH;
                const int copy = nc * CH < part;
                for (int t4 = 0; t4 < 4; t4++) {
                    if (copy) for (int l = 0; l < 16; l++) {
                        const int o = t4 * 1024 + l * 64;
                        _mm512_store_si512((__m512i*)(dst + o), _mm512_load_si512((const __m512i*)(src + o)));
                    }
                    work_tile(ring[c & 3] + t4 * 1024);
                }
            }
        }
        double r = part / (now() - t) / 1e9;
        if (r > best) best = r;
    }
    volatile int sink = _mm512_reduce_add_epi32(acc); (void)sink;
    j->value = best; return NULL;
}
int main(int argc, char** argv) {
    NT = (int)sysconf(_SC_NPROCESSORS_ONLN);
    buf = aligned_alloc(1 << 21, SZ); if (!getenv("NOHUGE")) madvise(buf, SZ, MADV_HUGEPAGE); memset(buf, 0, SZ);
    int ks[] = {0, 4, 8, 12, 16};
    for (int ki = 0; ki < 5; ki++) {
        K = ks[ki];
        struct mb_spread c = mb_one_then_all(fn, 5, 0, 0), r = mb_one_then_all(fn, 4, 0, 0);
        struct mb_spread a = mb_one_then_all(fn, 0, 0, 0), p = mb_one_then_all(fn, 1, 2048, 0);
        struct mb_spread s1 = mb_one_then_all(fn, 2, CH, 0), s2 = mb_one_then_all(fn, 2, 2 * CH, 0);
        printf("K=%2d TDP/KB | compute-only %5.1f | read-only %5.1f | tiles in place %5.1f, +pf2K %5.1f | staged 1 ahead %5.1f, 2 ahead %5.1f   (one core; all cores mean x n: %5.1f %5.1f %5.1f %5.1f %5.1f %5.1f)\n",
               K, c.one, r.one, a.one, p.one, s1.one, s2.one, c.mean * NT, r.mean * NT, a.mean * NT, p.mean * NT, s1.mean * NT, s2.mean * NT);
        fflush(stdout);
    }
    long ds[] = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
    for (int ki = 1; ki <= 2; ki++) {
        K = ks[ki];
        printf("K=%d, prefetch distance: one core (all cores x n)", K);
        for (int di = 0; di < 8; di++) {
            struct mb_spread p = mb_one_then_all(fn, 1, ds[di], 0);
            printf(" | %ld B %5.1f (%5.1f)", ds[di], p.one, p.mean * NT); fflush(stdout);
        }
        printf("\n");
    }
    return 0;
}
