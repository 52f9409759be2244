// Can one core hide a DRAM stream under its own dot-product work? The AVX-512 BF16 kernel's
// question on CPUs without AMX (the Zen 5 dev VM): it reads KV at 2 / (1/C + 1/M), as if its
// work (C) and its memory time (M) added up.
//
// One thread walks an array far past the L3 in 64 B lines. For every line it does `w` dependent-
// free VDPBF16PS (12 accumulators) on the line's data, and it issues a software prefetch `d`
// lines ahead with a given hint (or none: the hardware prefetchers alone). The same walk over a
// window that stays in L2 gives the work's rate alone, and a walk with w = 0 the read's rate
// alone. Overlap = time(work in L2) + time(read alone) - time(both), over the smaller of the two:
// 1 means one hides the other completely, 0 means they add up.
// Build and run (AVX-512 BF16): gcc -O2 -mavx512f -mavx512bf16 dp_beside_stream.c -o dps && ./dps
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

#define BIG (1L << 30)   /* the DRAM array */
#define WIN (512L << 10) /* the L2 window (the work's rate alone) */

// walk `n` bytes of `b` (wrapping in a window of `wrap` bytes, a power of two), W products per
// line into 8 register accumulators, prefetch `d` lines ahead with hint h (0 none, 1 T0, 2 T1,
// 3 NTA); returns seconds
#define PF(p, h) do { if ((h) == 1) _mm_prefetch((p), _MM_HINT_T0); else if ((h) == 2) _mm_prefetch((p), _MM_HINT_T1); \
                      else if ((h) == 3) _mm_prefetch((p), _MM_HINT_NTA); } while (0)
#define WALK(W)                                                                                        \
static double walk##W(const char* b, long n, long wrap, int d, int h) {                                 \
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;    \
    const __m512bh q = (__m512bh)_mm512_set1_epi16(0x3F80);                                              \
    const long m = wrap - 1;                                                                           \
    double t = now();                                                                                  \
    for (long o = 0; o < n; o += 128) {                                                                \
        const long a = o & m;                                                                          \
        if (h) { PF(b + ((a + 64L * d) & m), h); PF(b + ((a + 64L * d + 64) & m), h); }                 \
        const __m512bh x = (__m512bh)_mm512_load_si512(b + a), y = (__m512bh)_mm512_load_si512(b + a + 64); \
        if (W == 0) { c0 = _mm512_add_ps(c0, (__m512)x); c1 = _mm512_add_ps(c1, (__m512)y); }            \
        for (int i = 0; i < W; i += 2) {                                                               \
            switch ((i / 2) & 3) {                                                                     \
            case 0: c0 = _mm512_dpbf16_ps(c0, x, q); c1 = _mm512_dpbf16_ps(c1, y, q); break;            \
            case 1: c2 = _mm512_dpbf16_ps(c2, x, q); c3 = _mm512_dpbf16_ps(c3, y, q); break;            \
            case 2: c4 = _mm512_dpbf16_ps(c4, x, q); c5 = _mm512_dpbf16_ps(c5, y, q); break;            \
            default: c6 = _mm512_dpbf16_ps(c6, x, q); c7 = _mm512_dpbf16_ps(c7, y, q); break;           \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    t = now() - t;                                                                                     \
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),              \
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));             \
    volatile float sink = _mm512_reduce_add_ps(s); (void)sink;                                         \
    return t;                                                                                          \
}
WALK(0)
WALK(4)
WALK(8)
WALK(16)
WALK(32)
static double walk(const char* b, long n, long wrap, int w, int d, int h) {
    switch (w) {
    case 0: return walk0(b, n, wrap, d, h);
    case 4: return walk4(b, n, wrap, d, h);
    case 8: return walk8(b, n, wrap, d, h);
    case 16: return walk16(b, n, wrap, d, h);
    default: return walk32(b, n, wrap, d, h);
    }
}

int main(void) {
    char* big = aligned_alloc(1 << 21, BIG);
    memset(big, 1, BIG);
    const long n = BIG;
    const char* HN[4] = {"none", "T0", "T1", "NTA"};
    printf("%3s %-5s %4s %9s %9s %9s %8s\n", "w", "hint", "d", "work GB/s", "read GB/s", "both GB/s", "overlap");
    const int ws[] = {4, 8, 16, 32};
    const int ds[] = {16, 64, 256};
    for (int wi = 0; wi < 4; wi++) {
        const int w = ws[wi];
        walk(big, WIN * 8, WIN, w, 0, 0);
        const double tw = walk(big, n, WIN, w, 0, 0);  // the work alone: same bytes, from L2
        for (int h = 0; h < 4; h++)
            for (int di = 0; di < (h ? 3 : 1); di++) {
                const int d = ds[di];
                const double tr = walk(big, n, BIG, 0, d, h);  // the read alone
                const double tb = walk(big, n, BIG, w, d, h);  // both
                const double lo = tw < tr ? tw : tr;
                printf("%3d %-5s %4d %9.1f %9.1f %9.1f %8.2f\n", w, HN[h], h ? d : 0, n / tw / 1e9, n / tr / 1e9,
                       n / tb / 1e9, (tw + tr - tb) / lo);
            }
    }
    return 0;
}
