// MLA decode attention (16 heads sharing one 576-value latent, V its first 512 values) on one
// core's AMX tiles, over two C layouts of the same KV:
//
//  * pairs (the C layout of writescope/kvcache/regions.py today, [bs/2][R][2]: element (t, d) at
//    pair row t/2, word 2d + t%2): Q.K on token-major copies (two VPERMT2W and two stores per
//    128 bytes of a pair row, then the copies are the A tiles, q the B tile) and P.V on the pair
//    rows in place (B = V, A = P): the schedule of csrc/attn_amx.cpp's MLA path;
//  * dpairs (a candidate: per 16 tokens, [R/2][16][2]: element (t, d) at row d/2 of the tile's
//    288 rows of 64 bytes, word 2(t%16) + d%2): Q.K with the KV tiles in place as the B operand
//    (A = q, 16 heads x 32 values; every B tile one contiguous 1 KB), and P.V with the KV tiles in
//    place as the A operand against P in two B tiles, one with each head's probability in the
//    even words and zeros in the odd ones, one the other way round (O's even and odd values):
//    no copy at all, for twice P.V's products (100 products a 32-token group against 68).
//
// Both run a pass of 256 tokens as the kernel does: Q.K over the pass, the softmax (exp2 of the
// scores; no running max: the values stay small), P's operands, P.V into O tiles loaded and
// stored once per pass and column set. Both prefetch the next pass into L2 (PREFETCHT1, spread
// over the pass's tile steps) and the next step's lines into L1 (PREFETCHT0), as the kernel
// does. Each is timed with its KV in L2 (one pass, again and again) and streamed from DRAM
// (each thread its own region: 1 GiB in all), alone on vCPU 0 and on every vCPU at once, beside a
// read of the same regions with the same prefetch and tile loads and no work. Prints ns per
// 32-token group and GB/s of KV read; a first check compares both schemes' O with a float64
// reference (relative error of bf16 P).
//
// Build and run (an AMX CPU, Linux): g++ -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f
//   -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma amx_mla_layout.cpp -o mlalayout && ./mlalayout
// The check alone on a CPU without AMX (the tile operations emulated, slowly):
//   g++ -O2 -pthread -DWS_AMX_EMULATE -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16
//   -mfma amx_mla_layout.cpp -o mlalayout-emu && ./mlalayout-emu --check
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../writescope/attention/csrc/attn_tiles.h"  // T_LOAD, T_DP, ...: tiles or their emulation
#include "../../writescope/attention/csrc/attn_v512.h"   // exp2_fast

enum { H = 16, R = 576, DV = 512, PASS = 256, NG = PASS / 32, NTT = PASS / 16, NKS = R / 32, NDT = DV / 16 };
static const long RS = 2L * R * 2;             // bytes of a pair row (pairs layout)
static const long GB = 16 * RS;                // bytes of a 32-token group (both layouts)
static const long TB = (long)R * 16 * 2;       // bytes of a 16-token tile (dpairs layout)
static const long PB = (long)PASS * R * 2;     // bytes of a pass

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void tiles_config() {
    syscall(SYS_arch_prctl, 0x1023, 18);
    alignas(64) uint8_t c[64] = {0};
    c[0] = 1;
    for (int t = 0; t < 8; t++) { c[16 + 2 * t] = 64; c[48 + t] = 16; }
    T_CFG(c);
}
static inline uint16_t bf16(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7FFF + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static inline float f32(uint16_t b) { uint32_t u = (uint32_t)b << 16; float x; memcpy(&x, &u, 4); return x; }


static inline void transpose16(__m512i* r) {  // 16 x 16 dwords, four stages of block swaps
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int b = 8; b >= 1; b >>= 1) {
        const __mmask16 hi = _mm512_test_epi32_mask(iota, _mm512_set1_epi32(b));
        const __m512i ilo = _mm512_mask_add_epi32(iota, hi, iota, _mm512_set1_epi32(16 - b));
        const __m512i ihi = _mm512_mask_add_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(b)), hi, iota, _mm512_set1_epi32(16));
        for (int i = 0; i < 16; ++i) {
            if (i & b) continue;
            const __m512i x = r[i], y = r[i + b];
            r[i] = _mm512_permutex2var_epi32(x, ilo, y);
            r[i + b] = _mm512_permutex2var_epi32(x, ihi, y);
        }
    }
}

// the L2 prefetch cursor over the next pass: k lines a tile step
struct Pf { const char* base; long next, total, k; };
static inline void pf_step(Pf& p) {
    for (long i = 0; i < p.k && p.next < p.total; ++i, ++p.next) _mm_prefetch(p.base + 64 * p.next, _MM_HINT_T1);
}

struct Work {
    uint16_t* qb;   // pairs: q as Q.K's B operand per 32-value step, [NKS][16 value pairs][16 heads][2]
    uint16_t* qa;   // dpairs: q as Q.K's A operand per step, [NKS][16 heads][32 values]
    uint16_t* kt;   // pairs: the token-major copies, two 4 KB buffers
    float* s;       // scores: pairs [PASS][16 heads]; dpairs [16 heads][PASS]
    uint16_t* pa;   // pairs: P as P.V's A operand, [NG][16 heads][32 tokens]; dpairs: [NTT][2][16 tokens][16 heads][2]
    float* o;       // pairs: O [16 heads][DV]; dpairs: [NDT][16 value pairs][16 heads] (even, odd value tiles alternate)
    int l1pf;       // the L1 prefetches (next step's lines)
};

static float g_scale = 0.0625f;  // the scores' scale before exp2

// ---- pairs: the kernel's schedule ----
static void pass_pairs(const char* kv, Work& w, Pf& pf) {
    const __m512i iev = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i iod = _mm512_add_epi16(iev, _mm512_set1_epi16(1));
    for (int g0 = 0; g0 < NG; g0 += 2) {
        T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
        for (int dc = 0; dc < NKS; dc++) {
            pf_step(pf);
            uint16_t* kt = w.kt + (dc & 1) * 2048;
            for (int g = 0; g < 2; g++) {
                const char* src = kv + (g0 + g) * GB + 128 * dc;
                for (int p = 0; p < 16; p++) {
                    const __m512i x = _mm512_loadu_si512(src + p * RS), y = _mm512_loadu_si512(src + p * RS + 64);
                    uint16_t* dst = kt + (2 * g + (p >> 3)) * 512 + 64 * (p & 7);
                    _mm512_store_si512(dst, _mm512_permutex2var_epi16(x, iev, y));
                    _mm512_store_si512(dst + 32, _mm512_permutex2var_epi16(x, iod, y));
                }
            }
            T_LOAD(6, w.qb + dc * 512, 64);
            T_LOAD(4, kt, 64); T_DP(0, 4, 6);
            T_LOAD(5, kt + 512, 64); T_DP(1, 5, 6);
            T_LOAD(4, kt + 1024, 64); T_DP(2, 4, 6);
            T_LOAD(5, kt + 1536, 64); T_DP(3, 5, 6);
            if (w.l1pf) {  // the next step's 128 bytes of each pair row (or the next groups' first)
                int gn = g0, dn = dc + 1;
                if (dn == NKS) { gn = g0 + 2; dn = 0; }
                if (gn < NG)
                    for (int g = gn; g < gn + 2; g++)
                        for (int p = 0; p < 16; p++) {
                            const char* q = kv + g * GB + p * RS + 128 * dn;
                            _mm_prefetch(q, _MM_HINT_T0); _mm_prefetch(q + 64, _MM_HINT_T0);
                        }
            }
        }
        float* sg = w.s + g0 * 32 * 16;  // token-major: C tile i = tokens 16i.. of the two groups
        T_STORE(0, sg, 64); T_STORE(1, sg + 256, 64); T_STORE(2, sg + 512, 64); T_STORE(3, sg + 768, 64);
    }
    const __m512i pidx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                          23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512 sc = _mm512_set1_ps(g_scale);
    for (int g = 0; g < NG; g++) {  // P[h][32 tokens] of each group: pairs interleaved, one transpose
        __m512i r[16];
        for (int p = 0; p < 16; p++) {
            const float* s = w.s + (g * 32 + 2 * p) * 16;
            const __m512 p0 = exp2_fast(_mm512_mul_ps(_mm512_load_ps(s), sc));
            const __m512 p1 = exp2_fast(_mm512_mul_ps(_mm512_load_ps(s + 16), sc));
            r[p] = _mm512_permutexvar_epi16(pidx, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        }
        transpose16(r);
        for (int h = 0; h < 16; h++) _mm512_store_si512(w.pa + g * 512 + 32 * h, r[h]);
    }
    for (int dc0 = 0; dc0 < NDT; dc0 += 4) {
        float* o0 = w.o + 16 * dc0;
        T_LOAD(0, o0, 2048); T_LOAD(1, o0 + 16, 2048); T_LOAD(2, o0 + 32, 2048); T_LOAD(3, o0 + 48, 2048);
        for (int g = 0; g < NG; g++) {
            pf_step(pf);
            const char* vp = kv + g * GB + 64 * dc0;
            T_LOAD(4, w.pa + g * 512, 64);
            T_LOAD(6, vp, RS); T_DP(0, 4, 6);
            T_LOAD(7, vp + 64, RS); T_DP(1, 4, 7);
            T_LOAD(6, vp + 128, RS); T_DP(2, 4, 6);
            T_LOAD(7, vp + 192, RS); T_DP(3, 4, 7);
            if (w.l1pf) {  // the next group's lines of these column tiles (or the first group's next ones)
                int gn = g + 1, dn = dc0;
                if (gn == NG) { gn = 0; dn += 4; }
                if (dn < NDT)
                    for (int r = 0; r < 16; r++)
                        for (int l = 0; l < 4; l++) _mm_prefetch(kv + gn * GB + r * RS + 64 * dn + 64 * l, _MM_HINT_T0);
            }
        }
        T_STORE(0, o0, 2048); T_STORE(1, o0 + 16, 2048); T_STORE(2, o0 + 32, 2048); T_STORE(3, o0 + 48, 2048);
    }
}

// ---- dpairs: both products on the KV tiles in place ----
static void pass_dpairs(const char* kv, Work& w, Pf& pf) {
    for (int t0 = 0; t0 < NTT; t0 += 4) {  // four 16-token tiles at a time
        T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
        for (int s = 0; s < NKS; s++) {
            pf_step(pf);
            T_LOAD(4, w.qa + s * 512, 64);
            const char* b = kv + t0 * TB + s * 1024;
            T_LOAD(5, b, 64); T_DP(0, 4, 5);
            T_LOAD(6, b + TB, 64); T_DP(1, 4, 6);
            T_LOAD(5, b + 2 * TB, 64); T_DP(2, 4, 5);
            T_LOAD(6, b + 3 * TB, 64); T_DP(3, 4, 6);
            if (w.l1pf) {  // the next step's four tiles (or the next four tiles' first)
                int tn = t0, sn = s + 1;
                if (sn == NKS) { tn = t0 + 4; sn = 0; }
                if (tn < NTT)
                    for (int i = 0; i < 4; i++)
                        for (int l = 0; l < 16; l++) _mm_prefetch(kv + (tn + i) * TB + sn * 1024 + 64 * l, _MM_HINT_T0);
            }
        }
        float* sg = w.s + t0 * 16;  // head-major: row h of C tile i = tokens 16(t0+i).. of head h
        T_STORE(0, sg, PASS * 4); T_STORE(1, sg + 16, PASS * 4); T_STORE(2, sg + 32, PASS * 4); T_STORE(3, sg + 48, PASS * 4);
    }
    const __m512 sc = _mm512_set1_ps(g_scale);
    for (int t = 0; t < NTT; t++) {  // P.V's B operands of each 16-token tile: P^T with zeros between
        __m512i r[16];
        for (int h = 0; h < 16; h++) {
            const __m512 p = exp2_fast(_mm512_mul_ps(_mm512_load_ps(w.s + h * PASS + 16 * t), sc));
            r[h] = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p));
        }
        transpose16(r);  // row k: dword h = P[h][16t + k] in its low word
        uint16_t* be = w.pa + t * 1024;
        for (int k = 0; k < 16; k++) {
            _mm512_store_si512(be + 32 * k, r[k]);
            _mm512_store_si512(be + 512 + 32 * k, _mm512_slli_epi32(r[k], 16));
        }
    }
    for (int d0 = 0; d0 < NDT / 2; d0 += 2) {  // two 32-value tiles (four O tiles) at a time
        float* o0 = w.o + d0 * 2 * 256;
        T_LOAD(0, o0, 64); T_LOAD(1, o0 + 256, 64); T_LOAD(2, o0 + 512, 64); T_LOAD(3, o0 + 768, 64);
        for (int t = 0; t < NTT; t++) {
            pf_step(pf);
            const uint16_t* be = w.pa + t * 1024;
            const char* a = kv + t * TB + d0 * 1024;
            T_LOAD(5, be, 64); T_LOAD(6, be + 512, 64);
            T_LOAD(4, a, 64); T_DP(0, 4, 5); T_DP(1, 4, 6);
            T_LOAD(7, a + 1024, 64); T_DP(2, 7, 5); T_DP(3, 7, 6);
            if (w.l1pf) {  // the next tile's two V tiles (or the first tile's next two)
                int tn = t + 1, dn = d0;
                if (tn == NTT) { tn = 0; dn += 2; }
                if (dn < NDT / 2)
                    for (int l = 0; l < 32; l++) _mm_prefetch(kv + tn * TB + dn * 1024 + 64 * l, _MM_HINT_T0);
            }
        }
        T_STORE(0, o0, 64); T_STORE(1, o0 + 256, 64); T_STORE(2, o0 + 512, 64); T_STORE(3, o0 + 768, 64);
    }
}

// ---- the read alone: the same lines, the same L2 prefetch, tile loads of 1 KB, no work ----
static void pass_read(const char* kv, Work& w, Pf& pf) {
    (void)w;
    for (long off = 0; off < PB; off += 4096) {
        pf_step(pf);
        T_LOAD(4, kv + off, 64); T_LOAD(5, kv + off + 1024, 64);
        T_LOAD(6, kv + off + 2048, 64); T_LOAD(7, kv + off + 3072, 64);
    }
}

enum { S_PAIRS, S_DPAIRS, S_DPAIRS_NOL1, S_PAIRS_NOL1, S_READ, NS };
static const char* SNAME[NS] = {"pairs (the kernel's schedule)", "dpairs (KV tiles in place)",
                                "dpairs without L1 prefetch", "pairs without L1 prefetch", "read: prefetch + tile loads"};
static const int STEPS[NS] = {NG / 2 * NKS + NDT / 4 * NG, NTT / 4 * NKS + NDT / 4 * NTT,
                              NTT / 4 * NKS + NDT / 4 * NTT, NG / 2 * NKS + NDT / 4 * NG, (int)(PB / 4096)};

static void layout_fill(char* dst, const uint16_t* kv_tm, long ntok, int dpairs) {
    // kv_tm: token-major [ntok][R] bf16; dst: ntok tokens in the pairs or the dpairs layout
    uint16_t* d = (uint16_t*)dst;
    for (long t = 0; t < ntok; t++)
        for (int c = 0; c < R; c++) {
            long i = dpairs ? (t / 16) * (TB / 2) + (c / 2) * 32 + (t % 16) * 2 + c % 2
                            : (t / 2) * (RS / 2) + 2 * c + t % 2;
            d[i] = kv_tm[t * R + c];
        }
}

static Work work_alloc(const float* q, int l1pf) {
    Work w;
    w.qb = (uint16_t*)aligned_alloc(64, NKS * 1024);
    w.qa = (uint16_t*)aligned_alloc(64, NKS * 1024);
    w.kt = (uint16_t*)aligned_alloc(64, 8192);
    w.s = (float*)aligned_alloc(64, PASS * 16 * 4);
    w.pa = (uint16_t*)aligned_alloc(64, NTT * 2048);
    w.o = (float*)aligned_alloc(64, H * DV * 4);
    w.l1pf = l1pf;
    for (int s = 0; s < NKS; s++)
        for (int k = 0; k < 16; k++)
            for (int h = 0; h < 16; h++)
                for (int j = 0; j < 2; j++) {
                    w.qb[s * 512 + k * 32 + 2 * h + j] = bf16(q[h * R + 32 * s + 2 * k + j]);
                    w.qa[s * 512 + h * 32 + 2 * k + j] = bf16(q[h * R + 32 * s + 2 * k + j]);
                }
    memset(w.o, 0, H * DV * 4);
    memset(w.kt, 0, 8192);
    return w;
}
static void work_free(Work& w) { free(w.qb); free(w.qa); free(w.kt); free(w.s); free(w.pa); free(w.o); }

static void run_pass(int scheme, const char* kv, Work& w, Pf& pf) {
    if (scheme == S_PAIRS || scheme == S_PAIRS_NOL1) pass_pairs(kv, w, pf);
    else if (scheme == S_READ) pass_read(kv, w, pf);
    else pass_dpairs(kv, w, pf);
}

// O[h][d] of one pass in either scheme's tile order -> [h][d]
static float o_at(const Work& w, int dpairs, int h, int d) {
    if (!dpairs) return w.o[h * DV + d];
    const int tile = d / 32, p = (d % 32) / 2, par = d % 2;  // value tile, pair in it, parity
    return w.o[(2 * tile + par) * 256 + p * 16 + h];
}

static int check() {
    tiles_config();
    srand(7);
    float* q = (float*)malloc(H * R * 4);
    uint16_t* kv = (uint16_t*)malloc(PASS * R * 2);
    for (int i = 0; i < H * R; i++) q[i] = f32(bf16((rand() / (float)RAND_MAX - 0.5f) * 2.0f));
    for (int i = 0; i < PASS * R; i++) kv[i] = bf16((rand() / (float)RAND_MAX - 0.5f) * 2.0f);
    double* ref = (double*)calloc(H * DV, sizeof(double));
    double refmax = 0;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < PASS; t++) {
            double s = 0;
            for (int c = 0; c < R; c++) s += (double)q[h * R + c] * f32(kv[t * R + c]);
            const double p = exp2(s * g_scale);
            for (int d = 0; d < DV; d++) ref[h * DV + d] += p * f32(kv[t * R + d]);
        }
    for (int i = 0; i < H * DV; i++) refmax = fmax(refmax, fabs(ref[i]));
    int bad = 0;
    for (int dp = 0; dp < 2; dp++) {
        char* buf = (char*)aligned_alloc(4096, PB);
        layout_fill(buf, kv, PASS, dp);
        Work w = work_alloc(q, 1);
        Pf pf = {buf, 0, 0, 0};
        run_pass(dp ? S_DPAIRS : S_PAIRS, buf, w, pf);
        double err = 0;
        for (int h = 0; h < H; h++)
            for (int d = 0; d < DV; d++) err = fmax(err, fabs(o_at(w, dp, h, d) - ref[h * DV + d]));
        printf("check %-8s max |O - ref| / max |ref| = %.2e\n", dp ? "dpairs" : "pairs", err / refmax);
        bad |= !(err / refmax < 2e-2);
        work_free(w);
        free(buf);
    }
    T_RELEASE();
    free(q); free(kv); free(ref);
    return bad;
}

struct Job { int cpu, scheme; long bytes; double secs, ns_per_group; pthread_barrier_t* bar; };

static void* job_run(void* arg) {
    Job* j = (Job*)arg;
    pin(j->cpu);
    tiles_config();
    const long npass = j->bytes / PB > 0 ? j->bytes / PB : 1;
    char* pool = (char*)aligned_alloc(4096, npass * PB);
    for (long i = 0; i < npass * PB / 2; i++) ((uint16_t*)pool)[i] = 0x3C00 + (i & 0x3F);  // small values
    float* q = (float*)malloc(H * R * 4);
    for (int i = 0; i < H * R; i++) q[i] = 0.01f * (i % 7);
    const int l1 = j->scheme != S_DPAIRS_NOL1 && j->scheme != S_PAIRS_NOL1;
    Work w = work_alloc(q, l1);
    memset(w.s, 0, PASS * 16 * 4);
    memset(w.pa, 0, NTT * 2048);
    const long kpf = npass > 1 ? (PB / 64 + STEPS[j->scheme] - 1) / STEPS[j->scheme] : 0;
    long p = 0, passes = 0;
    for (int i = 0; i < 2; i++) {  // warm
        Pf pf = {pool + ((p + 1) % npass) * PB, 0, PB / 64, kpf};
        run_pass(j->scheme, pool + p * PB, w, pf);
        p = (p + 1) % npass;
    }
    if (j->bar) pthread_barrier_wait(j->bar);
    const double t = now();
    do {
        for (int i = 0; i < 8; i++) {
            Pf pf = {pool + ((p + 1) % npass) * PB, 0, PB / 64, kpf};
            run_pass(j->scheme, pool + p * PB, w, pf);
            p = (p + 1) % npass;
        }
        passes += 8;
    } while (now() - t < j->secs);
    j->ns_per_group = (now() - t) / passes / NG * 1e9;
    T_RELEASE();
    work_free(w);
    free(q);
    free(pool);
    return NULL;
}

// the scheme on `n` vCPUs at once (vCPUs 0..n-1), each over `bytes`; returns the mean ns per group
static double measure(int scheme, int n, long bytes, double secs, double* lo, double* hi) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, n);
    Job* js = (Job*)calloc(n, sizeof(Job));
    pthread_t* ts = (pthread_t*)calloc(n, sizeof(pthread_t));
    for (int c = 0; c < n; c++) { js[c] = Job{c, scheme, bytes, secs, 0, &bar}; pthread_create(&ts[c], NULL, job_run, &js[c]); }
    double mean = 0; *lo = 1e300; *hi = 0;
    for (int c = 0; c < n; c++) {
        pthread_join(ts[c], NULL);
        mean += js[c].ns_per_group / n;
        *lo = fmin(*lo, js[c].ns_per_group); *hi = fmax(*hi, js[c].ns_per_group);
    }
    free(js); free(ts);
    pthread_barrier_destroy(&bar);
    return mean;
}

int main(int argc, char** argv) {
    const int bad = check();
    if (argc > 1 && !strcmp(argv[1], "--check")) return bad;
    const int n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const long total = 1L << 30;
    printf("%d vCPUs; ns per 32-token group (GB/s of KV read: one vCPU / all vCPUs together)\n", n);
    printf("%-32s %-5s %24s %32s\n", "scheme", "KV", "1 vCPU", "all vCPUs: mean (range)");
    for (int rep = 0; rep < 3; rep++)
        for (int where = 0; where < 2; where++)
            for (int s = 0; s < NS; s++) {
                if (where == 0 && s == S_READ) continue;
                double lo, hi;
                const double one = measure(s, 1, where ? total : PB, 0.4, &lo, &hi);
                const double all = measure(s, n, where ? total / n : PB, 0.4, &lo, &hi);
                printf("%-32s %-5s %10.0f (%6.1f GB/s) %10.0f (%.0f-%.0f; %6.1f GB/s)\n", SNAME[s],
                       where ? "DRAM" : "L2", one, GB / one, all, lo, hi, n * GB / all);
                fflush(stdout);
            }
    return bad;
}
