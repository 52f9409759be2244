// How fast can a core read the CPU attention kernel's blocks when it does nothing else with them?
// The kernel reads a C-layout block (one KV head's tile: 32 KB for GQA 128-dim records and
// 64-token blocks) at a time, the blocks scattered over the pool, and prefetches the next block's
// lines one by one over the current block's work. This reads a 1 GiB array TILE bytes at a time
// with 64-byte vector loads (a sum), the tiles in random order or in address order, with no
// software prefetch (mode 0), or prefetching the tile DIST tiles ahead, a line per line read,
// into L2 (1), L1 (2), L3 (3, PREFETCHT2), NTA (4), or only the first two lines of each 4 KB of
// it into L2 (5) or L1 (6) (the hardware prefetchers left to do the rest). WORK FMAs per line
// stand for the kernel's work (0: a pure read).
// Eighty-second session, the 2-core Zen 4 dev VM, two threads, 32 KB tiles: in address order
// without prefetch (what the read probe does) 30-37 GB/s in the VM's slow phases and 43-52 in its
// fast ones; random order, mode 1 (the kernel's way): 28-31 and 40-47; mode 0 20-27; modes 5 and
// 6 21-27; DIST 2 and 4 within 10% of 1; tiles of 64-256 KB 27-33 (slow phase). The kernel itself
// read 23-28 GB/s in both phases (docs/PERFORMANCE.md, the eighty-second session).
// Build and run (x86-64 with AVX-512, Linux):
//   gcc -O2 -pthread block_read.c -o br && ./br MODE THREADS TILE SHUFFLED DIST WORK
//   e.g. ./br 1 2 32768 1 1 0 (the kernel's access) and ./br 0 2 32768 0 1 0 (the probe's)
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static char* arena;
static size_t ntiles;
static int tile, mode, dist, work;
static int* order;

typedef struct { size_t t0, t1; float s; } Span;

__attribute__((target("avx512f"))) static void* run(void* p) {
    Span* a = p;
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_set1_ps(1.0f);
    const int lines = tile / 64;
    for (size_t i = a->t0; i < a->t1; i++) {
        const char* b = arena + (size_t)order[i] * tile;
        const char* nx = i + dist < a->t1 ? arena + (size_t)order[i + dist] * tile : b;
        for (int l = 0; l < lines; l++) {
            const char* pf = nx + l * 64;
            switch (mode) {
                case 1: _mm_prefetch(pf, _MM_HINT_T1); break;
                case 2: _mm_prefetch(pf, _MM_HINT_T0); break;
                case 3: _mm_prefetch(pf, _MM_HINT_T2); break;
                case 4: _mm_prefetch(pf, _MM_HINT_NTA); break;
                case 5: if ((l & 63) < 2) _mm_prefetch(pf, _MM_HINT_T1); break;
                case 6: if ((l & 63) < 2) _mm_prefetch(pf, _MM_HINT_T0); break;
            }
            const __m512 v = _mm512_load_ps((const float*)(b + l * 64));
            acc = _mm512_add_ps(acc, v);
            for (int w = 0; w < work; w++) acc2 = _mm512_fmadd_ps(acc2, v, acc2);
        }
    }
    a->s = _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(acc2);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s MODE THREADS TILE SHUFFLED DIST WORK\n", argv[0]);
        return 2;
    }
    mode = atoi(argv[1]);
    int threads = atoi(argv[2]);
    tile = atoi(argv[3]);
    const int shuffled = atoi(argv[4]);
    dist = atoi(argv[5]);
    work = atoi(argv[6]);
    if (threads < 1 || threads > 64 || tile < 64 || tile % 64 || dist < 1) {
        fprintf(stderr, "THREADS 1-64, TILE a multiple of 64, DIST >= 1\n");
        return 2;
    }
    const size_t bytes = (size_t)1 << 30;
    arena = aligned_alloc(1 << 21, bytes);
    madvise(arena, bytes, MADV_HUGEPAGE);
    memset(arena, 1, bytes);
    ntiles = bytes / tile;
    order = malloc(ntiles * sizeof(int));
    for (size_t i = 0; i < ntiles; i++) order[i] = (int)i;
    if (shuffled)
        for (size_t i = ntiles - 1; i > 0; i--) {
            size_t j = (size_t)rand() % (i + 1);
            int t = order[i]; order[i] = order[j]; order[j] = t;
        }
    double best = 0;
    float sink = 0;
    for (int rep = 0; rep < 4; rep++) {
        pthread_t th[64];
        Span s[64];
        const double t0 = now();
        for (int i = 0; i < threads; i++) {
            s[i].t0 = ntiles * i / threads;
            s[i].t1 = ntiles * (i + 1) / threads;
            pthread_create(&th[i], 0, run, &s[i]);
        }
        for (int i = 0; i < threads; i++) { pthread_join(th[i], 0); sink += s[i].s; }
        const double g = bytes / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    printf("mode %d threads %d tile %d %s dist %d work %d: best of 4 %.1f GB/s%s\n", mode, threads,
           tile, shuffled ? "random order" : "address order", dist, work, best, sink == 1.5f ? " " : "");
    return 0;
}
