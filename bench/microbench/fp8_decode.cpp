// FP8 (e4m3) decode products on one and on every core, the two forms of
// writescope/layers/csrc/cpu_experts.cpp (fifty-fourth session):
//
//  * old: each 32-code line converted to bf16(q * s) -- two fp32 halves (sign-extend, shift,
//    mask, multiply by s * 2^120) and a rounding pack, ~10 ops -- then one VDPBF16PS a token
//    (k_fp8_avx512bf16, the converted tiles' numbers);
//  * new: the line as bf16 of q * 2^-120 in three integer ops (sign-extend to 16 bits, shift by
//    4, mask), one VDPBF16PS a token into per-block accumulators (NA chains a token), each
//    block's sum times its scale at the block's end (k_fp8x_avx512bf16 without its rare
//    subnormal lines: the codes here have none).
//
// One 16-row tile of K = 2048 (Qwen3's hidden size) at a time, 1 to 8 tokens; in L2 (8 tiles,
// 256 KB, again and again) and from DRAM (1 GiB, each thread its own part). Prints GB/s of
// FP8 bytes. Build: g++ -O2 -march=native -std=c++17 -pthread fp8_decode.cpp -o fp8_decode
// On the AMX dev VM (2-core Xeon, 2026-12-05), one token: old 13.5-13.6, new (4 chains) 23.1-25.9
// GB/s a core in L2; from DRAM one core 9.0 -> 10.5-10.9, two cores 17.6-17.9 -> 22.3-22.5.
// Four tokens: 6.2-6.5 -> 7.0-8.1 in L2 (the per-token VDPBF16PS and broadcast dominate).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include <chrono>
#include <thread>
#include <vector>
typedef uint16_t bf16_t;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
#define AHEAD 4096
static inline __m512bh fp8_line(const uint8_t* p, __m512 sv) {
  const __m512i keep = _mm512_set1_epi32((int)0x87F00000u);
  const __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16)));
  const __m512 lo = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(a, 20), keep)), sv);
  const __m512 hi = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(c, 20), keep)), sv);
  return _mm512_cvtne2ps_pbh(hi, lo);
}
template <int MB>
static void k_old(const uint8_t* W, int Kp, const bf16_t* X, long ldx, const float* srow, int bk, float* out) {
  __m512 acc[MB];
  for (int t = 0; t < MB; ++t) acc[t] = _mm512_setzero_ps();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const __m512 sv = _mm512_set1_ps(ldexpf(srow[b], 120));
    const int k1 = k0 + bk / 2;
    for (int kp = k0; kp < k1; ++kp) {
      const uint8_t* p = W + kp * 32;
      if (!(kp & 1)) _mm_prefetch((const char*)p + AHEAD, _MM_HINT_T0);
      const __m512bh wv = fp8_line(p, sv);
      for (int t = 0; t < MB; ++t) {
        int32_t pair; memcpy(&pair, X + t * ldx + 2 * kp, 4);
        acc[t] = _mm512_dpbf16_ps(acc[t], wv, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, acc[t]);
}
static inline __m512bh fp8_fast(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p));
  return (__m512bh)_mm512_and_si512(_mm512_slli_epi16(w, 4), _mm512_set1_epi16((short)0x87F0));
}
template <int MB, int NA>
static void k_new(const uint8_t* W, int Kp, const bf16_t* X, long ldx, const float* srow, int bk, float* out) {
  __m512 acc[MB];
  for (int t = 0; t < MB; ++t) acc[t] = _mm512_setzero_ps();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const __m512 sv = _mm512_set1_ps(srow[b]);
    const int k1 = k0 + bk / 2;
    __m512 blk[MB][NA];
    for (int t = 0; t < MB; ++t) for (int j = 0; j < NA; ++j) blk[t][j] = _mm512_setzero_ps();
    for (int kp = k0; kp < k1; kp += NA) {
      for (int j = 0; j < NA; ++j) {
        const uint8_t* p = W + (kp + j) * 32;
        if (!((kp + j) & 1)) _mm_prefetch((const char*)p + AHEAD, _MM_HINT_T0);
        const __m512bh wv = fp8_fast(p);
        for (int t = 0; t < MB; ++t) {
          int32_t pair; memcpy(&pair, X + t * ldx + 2 * (kp + j), 4);
          blk[t][j] = _mm512_dpbf16_ps(blk[t][j], wv, (__m512bh)_mm512_set1_epi32(pair));
        }
      }
    }
    for (int t = 0; t < MB; ++t) {
      __m512 s = blk[t][0];
      for (int j = 1; j < NA; ++j) s = _mm512_add_ps(s, blk[t][j]);
      acc[t] = _mm512_fmadd_ps(s, sv, acc[t]);
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, acc[t]);
}
typedef void (*kfn)(const uint8_t*, int, const bf16_t*, long, const float*, int, float*);
int main(int argc, char** argv) {
  const int Kp = 2048, bk = 128; const long tile = 16L * Kp;
  const size_t big = (size_t)1 << 30;
  uint8_t* W = (uint8_t*)aligned_alloc(4096, big);
  for (size_t i = 0; i < big; ++i) W[i] = (uint8_t)((i * 2654435761u >> 13) & 0x7f) | ((i & 1) << 7);
  // no NaN codes, no subnormals (the old form pays a microcode assist a subnormal lane)
  for (size_t i = 0; i < big; ++i) { if (((W[i] >> 3) & 15) == 15) W[i] ^= 0x40; if (((W[i] >> 3) & 15) == 0) W[i] |= 0x08; }
  std::vector<bf16_t> X(16 * Kp); for (int i = 0; i < 16 * Kp; ++i) X[i] = 0x3f80 ^ (i & 0x8000);
  std::vector<float> sr(Kp / bk, 1.0f);
  struct V { const char* n; kfn f; int mb; };
  V vs[] = {{"old1", k_old<1>, 1}, {"new1x1", k_new<1, 1>, 1}, {"new1x2", k_new<1, 2>, 1}, {"new1x4", k_new<1, 4>, 1},
            {"old4", k_old<4>, 4}, {"new4x1", k_new<4, 1>, 4}, {"new4x2", k_new<4, 2>, 4},
            {"old8", k_old<8>, 8}, {"new8x1", k_new<8, 1>, 8}};
  int thr[] = {1, 2};
  for (int rep = 0; rep < 2; ++rep)
  for (int nt : thr) for (int cache = 1; cache >= 0; --cache) for (auto& v : vs) {
    std::vector<double> g(nt); std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t) th.emplace_back([&, t] {
      alignas(64) float out[16 * 16];
      const size_t part = big / nt; const uint8_t* base = W + t * part;
      const long ntiles = cache ? 8 : part / tile;  // 8 tiles = 256 KB in L2
      const long calls = cache ? 4000 : ntiles;
      double t0 = now();
      for (long c = 0; c < calls; ++c) v.f(base + (c % ntiles) * tile, Kp, X.data(), Kp, sr.data(), bk, out);
      g[t] = calls * tile / (now() - t0) / 1e9; });
    for (auto& x : th) x.join();
    double tot = 0; for (double x : g) tot += x;
    printf("thr %d %s %-7s %6.1f GB/s fp8\n", nt, cache ? "L2  " : "DRAM", v.n, tot);
  }
}
