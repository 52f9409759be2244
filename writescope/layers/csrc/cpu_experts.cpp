// Routed-expert FFN on the CPU: y[t] = sum_j w[t,j] * down_e(silu(gate_e(x[t])) * up_e(x[t])).
//
// Built on first use by writescope/layers/cpu_experts.py (g++ -O3 -fopenmp -shared, loaded with
// ctypes: no torch headers, so it compiles in seconds) into one .so holding every code path; the
// path is chosen at run time (generic C++ / AVX2+FMA / AVX-512F / AVX-512 BF16 / AMX-BF16).
//
// Design (what we took from KTransformers' kt-kernel AMX/AVX-512 MoE operators and llama.cpp's
// ggml-cpu MUL_MAT_ID; the code is our own):
//  * weights are repacked once, at load, into 16-output-row tiles in the "VNNI" order
//    [tile][K/2][16 rows][2]: one 64-byte line holds 16 rows x one k-pair, which is exactly one
//    AVX-512 register for VDPBF16PS and one row of an AMX B tile, and 16 consecutive lines are one
//    1 KB AMX B tile.  gate and up tiles of the same rows are stored back to back, so one work item
//    streams 2 x 16 x H contiguous weights;
//  * tokens are grouped by expert (counting sort, as llama.cpp's mul_mat_id does), gathered into a
//    per-expert block, and every activated expert's weights are read exactly once per call: the
//    token loop runs inside the tile (the tile stays in L1/L2 while several token blocks use it);
//  * phase 1 parallelises over (expert, 16-row tile of I); phase 2 over 16-column tiles of the
//    output, looping over the activated experts inside, so each thread owns its output columns and
//    accumulates w * y without atomics (deterministic order);
//  * fp32 accumulation everywhere; the intermediate h = silu(g) * u is rounded to the weight dtype
//    (bf16) before the down projection, as torch's bf16 linear chain does;
//  * block-wise FP8 weights (e4m3 with one fp32 scale per bo x bi block, the -FP8 checkpoints'
//    format: writescope/models/quantization.py) are stored one byte each in the bf16 tile order
//    and turned, one 16-row tile at a time, into a per-thread bf16 tile of bf16(q * s) -- the
//    values a checkpoint dequantized at load holds -- which the bf16 micro-kernels then read.
//    The CPU reads half the bytes from DRAM; the bf16 tile stays in L2. Decode calls (up to 16
//    tokens an expert, AVX-512 BF16) compute on the codes as they are instead: each scale
//    block's sum of q * x, times its scale (k_fp8x_avx512bf16, "exact products").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__x86_64__) || defined(_M_X64)
#define WS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef uint16_t bf16_t;

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512BF16 = 3, ISA_AMX = 4 };
enum { W_BF16 = 0, W_F32 = 1, W_FP8 = 2 };

static inline float bf16_to_f32(bf16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline bf16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

static inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// --------------------------------------------------------------------------------------------
// Micro-kernels: out[t][r] = sum_k W[r][k] * X[t][k] for one 16-row tile and MB tokens.
// W: packed tile (bf16: [Kp/2][16][2]; f32: [Kp][16]); X: MB rows of Kp activations, stride ldx
// (fp32 activations, except the BF16-dot paths, which take bf16 activations).
// --------------------------------------------------------------------------------------------
template <int MB>
static void k_generic_bf16(const void* Wv, int Kp, const void* Xv, long ldx, float* out) {
  const bf16_t* W = (const bf16_t*)Wv;
  const float* X = (const float*)Xv;
  float acc[MB][16];
  for (int t = 0; t < MB; ++t)
    for (int r = 0; r < 16; ++r) acc[t][r] = 0.f;
  for (int kp = 0; kp < Kp / 2; ++kp) {
    const bf16_t* w = W + (long)kp * 32;
    float we[16], wo[16];
    for (int r = 0; r < 16; ++r) {
      we[r] = bf16_to_f32(w[2 * r]);
      wo[r] = bf16_to_f32(w[2 * r + 1]);
    }
    for (int t = 0; t < MB; ++t) {
      const float xe = X[t * ldx + 2 * kp], xo = X[t * ldx + 2 * kp + 1];
      for (int r = 0; r < 16; ++r) acc[t][r] += we[r] * xe + wo[r] * xo;
    }
  }
  for (int t = 0; t < MB; ++t)
    for (int r = 0; r < 16; ++r) out[t * 16 + r] = acc[t][r];
}

template <int MB>
static void k_generic_f32(const void* Wv, int Kp, const void* Xv, long ldx, float* out) {
  const float* W = (const float*)Wv;
  const float* X = (const float*)Xv;
  float acc[MB][16];
  for (int t = 0; t < MB; ++t)
    for (int r = 0; r < 16; ++r) acc[t][r] = 0.f;
  for (int k = 0; k < Kp; ++k) {
    const float* w = W + (long)k * 16;
    for (int t = 0; t < MB; ++t) {
      const float xv = X[t * ldx + k];
      for (int r = 0; r < 16; ++r) acc[t][r] += w[r] * xv;
    }
  }
  for (int t = 0; t < MB; ++t)
    for (int r = 0; r < 16; ++r) out[t * 16 + r] = acc[t][r];
}

#ifdef WS_X86
// bytes ahead in the weight stream (64 lines of bf16): 4096 since the fifty-third session, where
// on the 2-core AMX dev VM the DRAM waits and the kernel's work added up at 1024 (the first
// value, never tuned): 1024 -> 4096 took Qwen3-30B-A3B's one-token calls from 23.5-23.9 to
// 26.3-26.9 GB/s over bf16 experts and from 14.5-14.9 to 17.2-17.4 over FP8 ones, and the AMX
// path's 4 and 32 tokens up in six of eight pairs, level in one, 6% down in one
// (bench/results/2026-12-05d-devvm-xeon/README.md)
#define WS_PREFETCH_AHEAD 4096

// One 64-byte line's 16 rows x one k-pair (e: the even input's weights of rows 0-7 / 8-15, o:
// the odd's) times each token's pair kp of X (fp32): a0 / a1 accumulate rows 0-7 / 8-15.
template <int MB>
__attribute__((target("avx2,fma"), always_inline)) static inline void avx2_line_tokens(
    __m256* a0, __m256* a1, __m256 e0, __m256 o0, __m256 e1, __m256 o1, const float* X, long ldx,
    int kp) {
  for (int t = 0; t < MB; ++t) {
    const __m256 xe = _mm256_broadcast_ss(X + t * ldx + 2 * kp);
    const __m256 xo = _mm256_broadcast_ss(X + t * ldx + 2 * kp + 1);
    a0[t] = _mm256_fmadd_ps(e0, xe, a0[t]);
    a1[t] = _mm256_fmadd_ps(e1, xe, a1[t]);
    a0[t] = _mm256_fmadd_ps(o0, xo, a0[t]);
    a1[t] = _mm256_fmadd_ps(o1, xo, a1[t]);
  }
}

template <int MB>
__attribute__((target("avx2,fma"), always_inline)) static inline void avx2_store(
    const __m256* a0, const __m256* a1, float* out) {
  for (int t = 0; t < MB; ++t) {
    _mm256_storeu_ps(out + t * 16, a0[t]);
    _mm256_storeu_ps(out + t * 16 + 8, a1[t]);
  }
}

template <int MB>
__attribute__((target("avx2,fma"))) static void k_avx2_bf16(const void* Wv, int Kp, const void* Xv,
                                                          long ldx, float* out) {
  const bf16_t* W = (const bf16_t*)Wv;
  const float* X = (const float*)Xv;
  __m256 a0[MB], a1[MB];
  for (int t = 0; t < MB; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  for (int kp = 0; kp < Kp / 2; ++kp) {
    const char* p = (const char*)(W + (long)kp * 32);
    _mm_prefetch(p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
    const __m256i v0 = _mm256_loadu_si256((const __m256i*)p);
    const __m256i v1 = _mm256_loadu_si256((const __m256i*)(p + 32));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
    avx2_line_tokens<MB>(a0, a1, e0, o0, e1, o1, X, ldx, kp);
  }
  avx2_store<MB>(a0, a1, out);
}

template <int MB>
__attribute__((target("avx2,fma"))) static void k_avx2_f32(const void* Wv, int Kp, const void* Xv,
                                                         long ldx, float* out) {
  const float* W = (const float*)Wv;
  const float* X = (const float*)Xv;
  __m256 a0[MB], a1[MB];
  for (int t = 0; t < MB; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  for (int k = 0; k < Kp; ++k) {
    const float* p = W + (long)k * 16;
    _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8);
    for (int t = 0; t < MB; ++t) {
      const __m256 xv = _mm256_broadcast_ss(X + t * ldx + k);
      a0[t] = _mm256_fmadd_ps(w0, xv, a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, xv, a1[t]);
    }
  }
  for (int t = 0; t < MB; ++t) {
    _mm256_storeu_ps(out + t * 16, a0[t]);
    _mm256_storeu_ps(out + t * 16 + 8, a1[t]);
  }
}

template <int MB>
__attribute__((target("avx512f"))) static void k_avx512_bf16(const void* Wv, int Kp, const void* Xv,
                                                            long ldx, float* out) {
  const bf16_t* W = (const bf16_t*)Wv;
  const float* X = (const float*)Xv;
  __m512 a[MB];
  for (int t = 0; t < MB; ++t) a[t] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  for (int kp = 0; kp < Kp / 2; ++kp) {
    const char* p = (const char*)(W + (long)kp * 32);
    _mm_prefetch(p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512((const void*)p);
    const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
    for (int t = 0; t < MB; ++t) {
      a[t] = _mm512_fmadd_ps(e, _mm512_set1_ps(X[t * ldx + 2 * kp]), a[t]);
      a[t] = _mm512_fmadd_ps(o, _mm512_set1_ps(X[t * ldx + 2 * kp + 1]), a[t]);
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, a[t]);
}

template <int MB>
__attribute__((target("avx512f"))) static void k_avx512_f32(const void* Wv, int Kp, const void* Xv,
                                                           long ldx, float* out) {
  const float* W = (const float*)Wv;
  const float* X = (const float*)Xv;
  __m512 a[MB];
  for (int t = 0; t < MB; ++t) a[t] = _mm512_setzero_ps();
  for (int k = 0; k < Kp; ++k) {
    const float* p = W + (long)k * 16;
    _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
    const __m512 w = _mm512_loadu_ps(p);
    for (int t = 0; t < MB; ++t) a[t] = _mm512_fmadd_ps(w, _mm512_set1_ps(X[t * ldx + k]), a[t]);
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, a[t]);
}

// VDPBF16PS: a[r] += W[r][2kp]*x[2kp] + W[r][2kp+1]*x[2kp+1] (products exact in fp32, fp32 sum).
template <int MB>
__attribute__((target("avx512f,avx512bf16"))) static void k_avx512bf16_bf16(const void* Wv, int Kp,
                                                                          const void* Xv, long ldx,
                                                                          float* out) {
  const bf16_t* W = (const bf16_t*)Wv;
  const bf16_t* X = (const bf16_t*)Xv;
  __m512 a[MB];
  for (int t = 0; t < MB; ++t) a[t] = _mm512_setzero_ps();
  for (int kp = 0; kp < Kp / 2; ++kp) {
    const char* p = (const char*)(W + (long)kp * 32);
    _mm_prefetch(p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512((const void*)p);
    for (int t = 0; t < MB; ++t) {
      int32_t pair;
      std::memcpy(&pair, X + t * ldx + 2 * kp, 4);
      a[t] = _mm512_dpbf16_ps(a[t], (__m512bh)v, (__m512bh)_mm512_set1_epi32(pair));
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, a[t]);
}
#endif  // WS_X86

// --------------------------------------------------------------------------------------------
// FP8 (e4m3) tiles -> bf16 tiles: dst[i] = bf16(q[i] * s), s = srow[k / bk] for the element's
// input index k (a k-pair never straddles a block: bk is even; the K padding past the last of
// the nb blocks holds zeros and takes the last scale). Tile order [Kp/2][16][2].
// --------------------------------------------------------------------------------------------
static inline float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v = e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
  if (e == 15 && m == 7) v = NAN;
  return (b & 0x80) ? -v : v;
}

static void fp8_tile_generic(const uint8_t* W, int Kp, const float* srow, int bk, int nb,
                             bf16_t* dst) {
  static const std::vector<float> lut = [] {  // (a function-local static: built once, safely)
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) t[b] = e4m3_to_f32((uint8_t)b);
    return t;
  }();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {  // one scale per K block
    const float s = srow[std::min(b, nb - 1)];
    for (int kp = k0; kp < std::min(Kp / 2, k0 + bk / 2); ++kp)
      for (int i = 0; i < 32; ++i) dst[kp * 32 + i] = f32_to_bf16(lut[W[kp * 32 + i]] * s);
  }
}

#ifdef WS_X86
// e4m3 -> fp32 is exact with the byte sign-extended, shifted up by 20 and masked to the sign and
// the 7 magnitude bits (bits 26..20: exponent bias 7 against 127, so the value times 2^-120;
// e4m3 subnormals land on fp32 subnormals, exactly); the scale times 2^120 undoes the 2^-120
// (both powers of two: the product's rounding is that of q * s) and VCVTNE2PS2BF16 rounds to
// nearest even, as torch's cast does. Two integer ops a 16 values (VCVTPH2PS through fp16 took
// 35% longer a line on the Zen 4 dev VM). The NaN codes (0x7f, 0xff) are not NaN here and a scale
// of 2^8 or more overflows: the loader refuses both (quantization.py QuantizedCheckpoint.get_fp8).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline __m512bh fp8_line(
    const uint8_t* p, __m512 sv) {  // one 32-byte line (16 rows x 2 inputs), sv = scale * 2^120
  const __m512i keep = _mm512_set1_epi32((int)0x87F00000u);
  const __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16)));
  const __m512 lo =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(a, 20), keep)), sv);
  const __m512 hi =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(c, 20), keep)), sv);
  return _mm512_cvtne2ps_pbh(hi, lo);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void fp8_tile_avx512bf16(
    const uint8_t* W, int Kp, const float* srow, int bk, int nb, bf16_t* dst) {
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {  // one scale per K block
    const __m512 sv = _mm512_set1_ps(std::ldexp(srow[std::min(b, nb - 1)], 120));
    const int k1 = std::min(Kp / 2, k0 + bk / 2);
    for (int kp = k0; kp < k1; ++kp) {
      const uint8_t* p = W + kp * 32;
      if (!(kp & 1)) _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
      _mm512_storeu_si512((void*)(dst + kp * 32), (__m512i)fp8_line(p, sv));
    }
  }
}

// The same conversion with AVX2 (CPUs without AVX-512 BF16: the tiles of calls of more than 16
// tokens an expert, and every call with WRITESCOPE_CPU_FP8_PRODUCTS=rounded): 8 codes at a time,
// fp32(q * s) rounded to nearest even by integer ops (q * s is finite: the loader refuses NaN
// codes and scales of 2^8 or more), 16 results packed to bf16 at once.
// 8 codes -> 8 dwords holding bf16(q * s) in bits 0-15 (sv = s * 2^120)
__attribute__((target("avx2,fma"), always_inline)) static inline __m256i fp8_cvt8_avx2(
    const uint8_t* p, __m256 sv) {
  const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i u = _mm256_castps_si256(_mm256_mul_ps(
      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(c, 20), _mm256_set1_epi32((int)0x87F00000u))), sv));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                         _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  return _mm256_srli_epi32(r, 16);
}

__attribute__((target("avx2,fma"))) static void fp8_tile_avx2(const uint8_t* W, int Kp,
                                                              const float* srow, int bk, int nb,
                                                              bf16_t* dst) {
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const __m256 sv = _mm256_set1_ps(std::ldexp(srow[std::min(b, nb - 1)], 120));
    const int k1 = std::min(Kp / 2, k0 + bk / 2);
    for (int kp = k0; kp < k1; ++kp) {
      const uint8_t* p = W + kp * 32;
      if (!(kp & 1)) _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {  // (packus interleaves 128-bit lanes: permute them back)
        const __m256i v = _mm256_packus_epi32(fp8_cvt8_avx2(p + 16 * h, sv), fp8_cvt8_avx2(p + 16 * h + 8, sv));
        _mm256_storeu_si256((__m256i*)(dst + kp * 32 + 16 * h), _mm256_permute4x64_epi64(v, 0xD8));
      }
    }
  }
}

// The same conversion fused into the VDPBF16PS micro-kernel (k_avx512bf16_bf16) for up to 16
// tokens: each line is converted once, in registers, and used by every token; the same
// products and sums as the converted tile through the bf16 kernel, without its store and
// reload (decode calls: one token block).
template <int MB>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void k_fp8_avx512bf16(
    const uint8_t* W, int Kp, const bf16_t* X, long ldx, const float* srow, int bk, int nb,
    float* out) {
  __m512 acc[MB];
  for (int t = 0; t < MB; ++t) acc[t] = _mm512_setzero_ps();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const __m512 sv = _mm512_set1_ps(std::ldexp(srow[std::min(b, nb - 1)], 120));
    const int k1 = std::min(Kp / 2, k0 + bk / 2);
    for (int kp = k0; kp < k1; ++kp) {
      const uint8_t* p = W + kp * 32;
      if (!(kp & 1)) _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
      const __m512bh wv = fp8_line(p, sv);
      for (int t = 0; t < MB; ++t) {
        int32_t pair;
        std::memcpy(&pair, X + t * ldx + 2 * kp, 4);
        acc[t] = _mm512_dpbf16_ps(acc[t], wv, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, acc[t]);
}

// FP8 decode on the codes as they are ("exact products", the default; ws_moe_forward's line
// masks select it): sum_k q_k x_k per scale block in fp32, times the block's scale s, with no
// bf16 rounding of q * s -- the block-scaled FP8 GEMM's arithmetic (DeepSeek's and the GPU
// block-FP8 kernels'); the converted tiles above round each weight to bf16 first, as a
// checkpoint dequantized at load holds it. The conversion is three integer ops a 32 codes:
// sign-extended to 16 bits, shifted up by 4 and masked to the sign and the 7 magnitude bits,
// each code is the bf16 of q * 2^-120 (exponent bias 7 against 127), where the converted tiles
// take ten ops a 32 codes (two fp32 halves, a multiply each, a rounding pack): 1.8x the lines a
// second per core from L2 and 1.2-1.3x from DRAM at one token on the AMX dev VM
// (fifty-fourth session, bench/microbench/fp8_decode.cpp).
//  * e4m3 subnormal codes (exponent field 0, q = m * 2^-9) come out as bf16 subnormals, which
//    VDPBF16PS reads as zero (it treats denormal inputs as zero whatever MXCSR says). The lines
//    that hold one (~1 in 300 for normal-looking weights: the checkpoints' amax / 448 scales put
//    ~1e-4 of the codes there) are flagged at load (ws_fp8_line_masks); for them a second,
//    rarely taken product adds those lanes as bf16 of m * 2^-121 (q * 2^-112) into an accumulator
//    of its own, scaled by 2^-8 at the block's end.
//  * Products of bf16 of q * 2^-120 with the activations would flush to zero (VDPBF16PS flushes
//    denormal results too), so each activation row is scaled first by 2^K (exactly: its normal
//    values' exponent fields raised by K; fp8x_scale_row), K putting its largest value just
//    under 2^127, and the row's outputs are multiplied back by 2^(120 - K): every product and
//    sum stays in fp32's normal range.
static inline bool lm_any(const uint64_t* lm, int a, int b) {  // any bit of [a, b) set
  for (int w = a >> 6; w <= (b - 1) >> 6; ++w) {
    uint64_t m = lm[w];
    const int lo = w * 64;
    if (a > lo) m &= ~0ull << (a - lo);
    if (b < lo + 64) m &= (1ull << (b - lo)) - 1;
    if (m) return true;
  }
  return false;
}

// Scales one bf16 activation row in place by 2^K (see above) and returns 2^(120 - K). Zeros and
// subnormals (read as zero by VDPBF16PS, as in the bf16 kernel) stay; a row holding inf or NaN,
// or nothing but zeros, is left as it is (K = 0).
static float fp8x_scale_row(bf16_t* x, int n) {
  int emax = 0;
  for (int i = 0; i < n; ++i) emax = std::max(emax, (int)((x[i] >> 7) & 0xff));
  const int K = (emax == 0 || emax == 255) ? 0 : std::min(std::max(253 - emax, 0), 240);
  if (K)
    for (int i = 0; i < n; ++i)
      if ((x[i] >> 7) & 0xff) x[i] = (bf16_t)(x[i] + (K << 7));
  return std::ldexp(1.0f, 120 - K);
}

// one line (kp) of the exact-products kernel: acc[t * stride] += codes . x_t's pair kp; returns
// the codes, sign-extended to 16 bits
template <int MB>
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) static inline __m512i fp8x_line(
    const uint8_t* W, int kp, const bf16_t* X, long ldx, __m512* acc, int stride, __m512i keep) {
  const uint8_t* p = W + (long)kp * 32;
  if (!(kp & 1)) _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p));
  const __m512bh wv = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(w, 4), keep);
  for (int t = 0; t < MB; ++t) {
    int32_t pair;
    std::memcpy(&pair, X + t * ldx + 2 * kp, 4);
    acc[t * stride] = _mm512_dpbf16_ps(acc[t * stride], wv, (__m512bh)_mm512_set1_epi32(pair));
  }
  return w;
}

template <int MB, int NA>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void k_fp8x_avx512bf16(
    const uint8_t* W, int Kp, const bf16_t* X, long ldx, const float* srow, int bk, int nb,
    const uint64_t* lm, const float* tf, float* out) {
  const __m512i keep = _mm512_set1_epi16((short)0x87F0);
  // bf16 of m * 2^-121, m = 0..7 (index = the code's low 5 bits: m, its exponent bits 0)
  alignas(64) static const uint16_t sub_a[32] = {0, 0x0300, 0x0380, 0x03C0, 0x0400, 0x0420,
                                                 0x0440, 0x0460};
  const __m512i sub_t = _mm512_load_si512((const void*)sub_a);
  __m512 acc[MB];
  for (int t = 0; t < MB; ++t) acc[t] = _mm512_setzero_ps();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const int k1 = std::min(Kp / 2, k0 + bk / 2);
    __m512 blk[MB][NA];
    for (int t = 0; t < MB; ++t)
      for (int j = 0; j < NA; ++j) blk[t][j] = _mm512_setzero_ps();
    if (!lm_any(lm, k0, k1)) {
      int kp = k0;
      for (; kp + NA <= k1; kp += NA)
        for (int j = 0; j < NA; ++j) fp8x_line<MB>(W, kp + j, X, ldx, &blk[0][j], NA, keep);
      for (; kp < k1; ++kp) fp8x_line<MB>(W, kp, X, ldx, &blk[0][0], NA, keep);
    } else {  // (rare) a line with subnormal codes: their lanes again, at q * 2^-112
      __m512 cor[MB];
      for (int t = 0; t < MB; ++t) cor[t] = _mm512_setzero_ps();
      for (int kp = k0; kp < k1; ++kp) {
        const __m512i w = fp8x_line<MB>(W, kp, X, ldx, &blk[0][0], NA, keep);
        if (!((lm[kp >> 6] >> (kp & 63)) & 1)) continue;
        const __mmask32 sub = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x78)) &
                              _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x07));
        const __m512i mag = _mm512_maskz_permutexvar_epi16(sub, w, sub_t);
        const __m512i sgn = _mm512_and_si512(_mm512_slli_epi16(w, 8), _mm512_set1_epi16((short)0x8000));
        const __m512bh cv = (__m512bh)_mm512_maskz_mov_epi16(sub, _mm512_or_si512(mag, sgn));
        for (int t = 0; t < MB; ++t) {
          int32_t pair;
          std::memcpy(&pair, X + t * ldx + 2 * kp, 4);
          cor[t] = _mm512_dpbf16_ps(cor[t], cv, (__m512bh)_mm512_set1_epi32(pair));
        }
      }
      for (int t = 0; t < MB; ++t)
        blk[t][0] = _mm512_fmadd_ps(cor[t], _mm512_set1_ps(1.0f / 256.0f), blk[t][0]);
    }
    const __m512 sv = _mm512_set1_ps(srow[std::min(b, nb - 1)]);
    for (int t = 0; t < MB; ++t) {
      __m512 s = blk[t][0];
      for (int j = 1; j < NA; ++j) s = _mm512_add_ps(s, blk[t][j]);
      acc[t] = _mm512_fmadd_ps(s, sv, acc[t]);
    }
  }
  for (int t = 0; t < MB; ++t) _mm512_storeu_ps(out + t * 16, _mm512_mul_ps(acc[t], _mm512_set1_ps(tf[t])));
}

// The exact products on CPUs without AVX-512 BF16 (AVX2 + FMA, and AVX-512F machines, which run
// it too): the activations are fp32 there, so each code becomes fp32(q * s) -- the 32-bit trick
// above (q * 2^-120) times s * 2^120, one rounding in fp32, not bf16's -- and one FMA a token.
// Until the fifty-fourth session those CPUs converted the tiles with the generic code's table,
// one value at a time: 3 GB/s of FP8 bytes on the dev VM's two cores, a quarter of the bf16
// weights' rate. (An e4m3 subnormal code is an fp32 subnormal before the multiply: a microcode
// assist on Intel, ~1e-4 of the codes of normal-looking weights.)
template <int MB>
__attribute__((target("avx2,fma"))) static void k_fp8f_avx2(const uint8_t* W, int Kp,
                                                            const float* X, long ldx,
                                                            const float* srow, int bk, int nb,
                                                            float* out) {
  const __m256i keep = _mm256_set1_epi32((int)0x87F00000u);
  __m256 a0[MB], a1[MB];
  for (int t = 0; t < MB; ++t) a0[t] = a1[t] = _mm256_setzero_ps();
  for (int k0 = 0, b = 0; k0 < Kp / 2; k0 += bk / 2, ++b) {
    const __m256 sv = _mm256_set1_ps(std::ldexp(srow[std::min(b, nb - 1)], 120));
    const int k1 = std::min(Kp / 2, k0 + bk / 2);
    for (int kp = k0; kp < k1; ++kp) {
      const uint8_t* p = W + (long)kp * 32;
      if (!(kp & 1)) _mm_prefetch((const char*)p + WS_PREFETCH_AHEAD, _MM_HINT_T0);
      // rows 0-7 and 8-15: dword r = (even code, odd code) of row r, each sign-extended to 16 bits
      const __m256i v0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
      const __m256i v1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p + 16)));
      const __m256 e0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v0, 20), keep)), sv);
      const __m256 o0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v0, 4), keep)), sv);
      const __m256 e1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v1, 20), keep)), sv);
      const __m256 o1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v1, 4), keep)), sv);
      avx2_line_tokens<MB>(a0, a1, e0, o0, e1, o1, X, ldx, kp);
    }
  }
  avx2_store<MB>(a0, a1, out);
}

typedef void (*fp8f_kern_t)(const uint8_t*, int, const float*, long, const float*, int, int,
                            float*);
static const fp8f_kern_t T_FP8F[5] = {nullptr, k_fp8f_avx2<1>, k_fp8f_avx2<2>, k_fp8f_avx2<3>,
                                      k_fp8f_avx2<4>};

static void fp8f_tokens(int mt, const uint8_t* W, int Kp, const float* X, long ldx,
                        const float* srow, int bk, int nb, float* out) {
  for (int t0 = 0; t0 < mt; t0 += 4)
    T_FP8F[std::min(4, mt - t0)](W, Kp, X + t0 * ldx, ldx, srow, bk, nb, out + t0 * 16);
}

typedef void (*fp8x_kern_t)(const uint8_t*, int, const bf16_t*, long, const float*, int, int,
                            const uint64_t*, const float*, float*);
static const fp8x_kern_t T_FP8X[9] = {
    nullptr, k_fp8x_avx512bf16<1, 4>, k_fp8x_avx512bf16<2, 2>, k_fp8x_avx512bf16<3, 1>,
    k_fp8x_avx512bf16<4, 1>, k_fp8x_avx512bf16<5, 1>, k_fp8x_avx512bf16<6, 1>,
    k_fp8x_avx512bf16<7, 1>, k_fp8x_avx512bf16<8, 1>};

// up to 16 tokens: at most 8 a pass over the tile (two accumulators a token must fit the registers)
static void fp8x_tokens(int mt, const uint8_t* W, int Kp, const bf16_t* X, long ldx,
                        const float* srow, int bk, int nb, const uint64_t* lm, const float* tf,
                        float* out) {
  for (int t0 = 0; t0 < mt; t0 += 8)
    T_FP8X[std::min(8, mt - t0)](W, Kp, X + t0 * ldx, ldx, srow, bk, nb, lm, tf + t0, out + t0 * 16);
}

typedef void (*fp8_kern_t)(const uint8_t*, int, const bf16_t*, long, const float*, int, int,
                           float*);
static const fp8_kern_t T_FP8_512BF[17] = {
    nullptr, k_fp8_avx512bf16<1>, k_fp8_avx512bf16<2>, k_fp8_avx512bf16<3>, k_fp8_avx512bf16<4>,
    k_fp8_avx512bf16<5>, k_fp8_avx512bf16<6>, k_fp8_avx512bf16<7>, k_fp8_avx512bf16<8>,
    k_fp8_avx512bf16<9>, k_fp8_avx512bf16<10>, k_fp8_avx512bf16<11>, k_fp8_avx512bf16<12>,
    k_fp8_avx512bf16<13>, k_fp8_avx512bf16<14>, k_fp8_avx512bf16<15>, k_fp8_avx512bf16<16>};
#endif

static inline void fp8_tile(const uint8_t* W, int Kp, const float* srow, int bk, int nb,
                            bf16_t* dst, int isa) {
#ifdef WS_X86
  if (isa >= ISA_AVX512BF16) return fp8_tile_avx512bf16(W, Kp, srow, bk, nb, dst);
  if (isa >= ISA_AVX2) return fp8_tile_avx2(W, Kp, srow, bk, nb, dst);
#endif
  (void)isa;
  fp8_tile_generic(W, Kp, srow, bk, nb, dst);
}

typedef void (*kern_t)(const void*, int, const void*, long, float*);

#define WS_TABLE16(fn)                                                                          \
  {nullptr, fn<1>, fn<2>, fn<3>, fn<4>, fn<5>, fn<6>, fn<7>, fn<8>, fn<9>, fn<10>, fn<11>, fn<12>, \
   fn<13>, fn<14>, fn<15>, fn<16>}
#define WS_TABLE4(fn) \
  {nullptr, fn<1>, fn<2>, fn<3>, fn<4>}

static const kern_t T_GEN_BF16[5] = WS_TABLE4(k_generic_bf16);
static const kern_t T_GEN_F32[5] = WS_TABLE4(k_generic_f32);
#ifdef WS_X86
static const kern_t T_AVX2_BF16[5] = WS_TABLE4(k_avx2_bf16);
static const kern_t T_AVX2_F32[5] = WS_TABLE4(k_avx2_f32);
static const kern_t T_512_BF16[17] = WS_TABLE16(k_avx512_bf16);
static const kern_t T_512_F32[17] = WS_TABLE16(k_avx512_f32);
static const kern_t T_512BF_BF16[17] = WS_TABLE16(k_avx512bf16_bf16);
#endif

struct KernSel {
  const kern_t* table;
  int mb;          // max tokens per register block
  bool act_bf16;   // activations handed to the kernel in bf16 (else fp32)
};

static KernSel select_kernel(int isa, int wdtype) {
#ifdef WS_X86
  if (isa >= ISA_AVX512BF16 && wdtype == W_BF16) return {T_512BF_BF16, 16, true};
  if (isa >= ISA_AVX512) return {wdtype == W_BF16 ? T_512_BF16 : T_512_F32, 16, false};
  if (isa >= ISA_AVX2) return {wdtype == W_BF16 ? T_AVX2_BF16 : T_AVX2_F32, 4, false};
#endif
  (void)isa;
  return {wdtype == W_BF16 ? T_GEN_BF16 : T_GEN_F32, 4, false};
}

// out[m][16] for m tokens (any m), re-reading the (cache-resident) tile per block of sel.mb tokens
static inline void tile_tokens(const KernSel& sel, const void* W, int Kp, const char* X, long ldx,
                               int esz, int m, float* out) {
  for (int t0 = 0; t0 < m; t0 += sel.mb) {
    const int mt = std::min(sel.mb, m - t0);
    sel.table[mt](W, Kp, X + (long)t0 * ldx * esz, ldx, out + t0 * 16);
  }
}

// --------------------------------------------------------------------------------------------
// AMX-BF16 path (Sapphire Rapids and later): one 16x16 fp32 C tile per 16 tokens x 16 outputs,
// A = 16 token rows x 32 bf16, B = one 1 KB packed tile chunk (16 k-pairs x 16 rows x 2).
// --------------------------------------------------------------------------------------------
#ifdef WS_X86
// GCC's tile intrinsics are asm statements that declare no memory operands beyond a pointer: a
// compiler barrier before LDTILECFG / TILELOADD (so the stores they read are not dropped or sunk
// past them: GCC 12 deleted the config's row and column stores, and LDTILECFG then faulted on the
// garbage) and after TILESTORED (so later reads of the output are not hoisted above it).
#define WS_FENCE() __asm__ volatile("" ::: "memory")

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile"))) static void amx_thread_config() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  WS_FENCE();
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) static void amx_thread_release() { _tile_release(); }

// gate/up for 16 token rows: G, U [16][16]
__attribute__((target("amx-tile,amx-bf16"))) static void amx_gate_up(const bf16_t* Wg, const bf16_t* Wu,
                                                                   int Kp, const bf16_t* X, long ldx,
                                                                   float* G, float* U) {
  WS_FENCE();
  _tile_zero(0);
  _tile_zero(1);
  for (int kc = 0; kc < Kp / 32; ++kc) {
    _tile_loadd(2, X + kc * 32, ldx * 2);
    _tile_loadd(3, Wg + (long)kc * 512, 64);
    _tile_loadd(4, Wu + (long)kc * 512, 64);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, G, 64);
  _tile_stored(1, U, 64);
  WS_FENCE();
}

__attribute__((target("amx-tile,amx-bf16"))) static void amx_tile(const bf16_t* W, int Kp,
                                                                const bf16_t* X, long ldx,
                                                                float* Y) {
  WS_FENCE();
  _tile_zero(0);
  for (int kc = 0; kc < Kp / 32; ++kc) {
    _tile_loadd(2, X + kc * 32, ldx * 2);
    _tile_loadd(3, W + (long)kc * 512, 64);
    _tile_dpbf16ps(0, 2, 3);
  }
  _tile_stored(0, Y, 64);
  WS_FENCE();
}
#endif

// --------------------------------------------------------------------------------------------
// ISA detection
// --------------------------------------------------------------------------------------------
static int g_amx_ok = -1;

static bool amx_request_permission() {
#if defined(WS_X86) && defined(__linux__)
  // Linux >= 5.16: ask for the AMX tile-data state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

extern "C" int ws_detect_isa(void) {
#ifdef WS_X86
  __builtin_cpu_init();
  int isa = ISA_GENERIC;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = ISA_AVX2;
  if (isa == ISA_AVX2 && __builtin_cpu_supports("avx512f")) isa = ISA_AVX512;
  if (isa == ISA_AVX512 && __builtin_cpu_supports("avx512bf16")) isa = ISA_AVX512BF16;
  if (isa == ISA_AVX512BF16) {
    unsigned a, b, c, d;
    bool amx = false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx = ((d >> 22) & 1) && ((d >> 24) & 1);
    if (amx) {
      if (g_amx_ok < 0) g_amx_ok = amx_request_permission() ? 1 : 0;
      if (g_amx_ok == 1) isa = ISA_AMX;
    }
  }
  return isa;
#else
  return ISA_GENERIC;
#endif
}

// --------------------------------------------------------------------------------------------
// Scratch (grow-only, per calling thread: no page faults on the hot path)
// --------------------------------------------------------------------------------------------
struct Scratch {
  std::vector<int32_t> count, active, row_off, tok_of;
  std::vector<float> wt_of, xf1, xf2;  // (xf*: exact-products FP8, per row: 2^(120 - K), or 0)
  std::vector<char> xg, h;
  void* grow(std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes + 64) v.resize(bytes + 64);
    return (void*)(((uintptr_t)v.data() + 63) & ~(uintptr_t)63);
  }
};
static thread_local Scratch g_scratch;

// --------------------------------------------------------------------------------------------
// Entry point
//   gu:   [E][Ip/16][2 (gate, up)][tile] packed tiles, tile = 16 x Hp elements
//   down: [E][Hp/16][tile], tile = 16 x Ip elements
//   x:    [N][H] in the compute dtype (bf16 for bf16 and FP8 weights, else fp32); ids [N][k]
//         int32 (-1: a slot left out, read elsewhere); tw [N][k] fp32; out [N][Hp] fp32 (written)
//   FP8 weights (wdtype W_FP8): gu and down hold one byte a weight in the bf16 tile order;
//         gus [E][2][ceil(I/bo)][ceil(H/bi)] and dns [E][ceil(H/bo)][ceil(I/bi)] fp32 scales,
//         bo a multiple of 16 and bi of 2 (unused otherwise); gum [E][Ip/16][2][ceil(Hp/128)]
//         and dnm [E][Hp/16][ceil(Ip/128)] their tiles' line masks (ws_fp8_line_masks): given,
//         decode calls take the exact-products kernel (k_fp8x_avx512bf16); null, the converted
//         bf16(q * s) tiles' products (k_fp8_avx512bf16)
// returns 0, or -1 when an expert id is out of range, -2 on a bad argument
// --------------------------------------------------------------------------------------------
extern "C" int ws_moe_forward(const void* gu, const void* down, int wdtype, int E, int H, int I,
                              int Hp, int Ip, const void* x, int N, const int32_t* ids,
                              const float* tw, int k, float* out, int isa, int amx_min,
                              int nthreads, const float* gus, const float* dns, int bo, int bi,
                              const uint64_t* gum, const uint64_t* dnm) {
  if (Hp % 32 || Ip % 32 || H > Hp || I > Ip || N < 0 || k <= 0 || E <= 0) return -2;
  if (wdtype != W_BF16 && wdtype != W_F32 && wdtype != W_FP8) return -2;
  const bool fp8 = wdtype == W_FP8;
  if (fp8 && (!gus || !dns || bo <= 0 || bi <= 0 || bo % 16 || bi % 2)) return -2;
  const int cdtype = fp8 ? W_BF16 : wdtype;  // the dtype the micro-kernels compute in
  const int detected = ws_detect_isa();
  if (isa > detected) isa = detected;
  const bool amx = (isa >= ISA_AMX) && cdtype == W_BF16;
  if (amx_min < 1) amx_min = 1;
  const KernSel sel = select_kernel(isa, cdtype);
  const int esz = (sel.act_bf16 || amx) ? 2 : 4;  // activation element size handed to the kernel
  const bool act_bf16 = esz == 2;
  const int wsz = fp8 ? 1 : cdtype == W_BF16 ? 2 : 4;  // stored weight element size
  const int xsz = cdtype == W_BF16 ? 2 : 4;            // the input activations' element size
  // FP8 scale grids: row blocks x column blocks per matrix
  const int gu_rb = (I + bo - 1) / std::max(bo, 1), gu_cb = (H + bi - 1) / std::max(bi, 1);
  const int dn_rb = (H + bo - 1) / std::max(bo, 1), dn_cb = (I + bi - 1) / std::max(bi, 1);
#ifdef WS_X86
  const bool fp8_fused = isa >= ISA_AVX512BF16;  // (else: converted tiles, any kernel)
#else
  const bool fp8_fused = false;
#endif
  const bool fp8x = fp8_fused && gum && dnm;  // the exact-products kernel
#ifdef WS_X86
  const bool fp8f = fp8 && !fp8_fused && isa >= ISA_AVX2 && gum && dnm;  // its fp32 form
#else
  const bool fp8f = false;
#endif
  const int gu_nw = (Hp / 2 + 63) / 64, dn_nw = (Ip / 2 + 63) / 64;  // mask words per tile
  if (nthreads < 1) nthreads = 1;

  Scratch& S = g_scratch;
  // ---- group (token, slot) assignments by expert: counting sort
  S.count.assign(E, 0);
  for (long i = 0; i < (long)N * k; ++i) {
    const int e = ids[i];
    if (e == -1) continue;  // a slot another reader takes (layers/expert_link.py): skipped
    if (e < 0 || e >= E) return -1;
    S.count[e]++;
  }
  S.active.clear();
  S.row_off.clear();
  int rows = 0;
  for (int e = 0; e < E; ++e) {
    if (!S.count[e]) continue;
    S.active.push_back(e);
    S.row_off.push_back(rows);
    const int m = S.count[e];
    const bool ea = amx && m >= amx_min;
    rows += ea ? (m + 15) / 16 * 16 : m;
  }
  const int nact = (int)S.active.size();
  S.row_off.push_back(rows);
  S.tok_of.assign(rows, -1);
  S.wt_of.assign(rows, 0.f);
  {
    std::vector<int32_t> fill(nact, 0), slot_of(E, -1);
    for (int j = 0; j < nact; ++j) slot_of[S.active[j]] = j;
    for (long i = 0; i < (long)N * k; ++i) {
      if (ids[i] == -1) continue;
      const int j = slot_of[ids[i]];
      const int r = S.row_off[j] + fill[j]++;
      S.tok_of[r] = (int)(i / k);
      S.wt_of[r] = tw[i];
    }
  }
  // exact-products FP8: the rows of experts that take the fused kernel, scaled (fp8x_scale_row)
  S.xf1.assign(fp8x ? rows : 0, 0.f);
  S.xf2.assign(fp8x ? rows : 0, 0.f);
  if (fp8x)
    for (int j = 0; j < nact; ++j) {
      const int m = S.count[S.active[j]];
      if (!(amx && m >= amx_min) && m <= 16)
        for (int r = S.row_off[j]; r < S.row_off[j + 1]; ++r) S.xf1[r] = 1.f;
    }
  float* xf1 = S.xf1.data();
  float* xf2 = S.xf2.data();
  char* xg = (char*)S.grow(S.xg, (size_t)rows * Hp * esz);
  char* hb = (char*)S.grow(S.h, (size_t)rows * Ip * esz);

  const long gu_tile = 16L * Hp, gu_expert = 2L * gu_tile * (Ip / 16);
  const long dn_tile = 16L * Ip, dn_expert = dn_tile * (Hp / 16);
  const int it = Ip / 16, ht = Hp / 16;
  const int n_items1 = nact * it;
  const char* GU = (const char*)gu;
  const char* DN = (const char*)down;
  const int32_t* row_off = S.row_off.data();
  const int32_t* active = S.active.data();
  const int32_t* tok_of = S.tok_of.data();
  const float* wt_of = S.wt_of.data();
  const int32_t* count = S.count.data();

#pragma omp parallel num_threads(nthreads)
  {
#ifdef WS_X86
    if (amx) amx_thread_config();
#endif
    // ---- gather token rows per expert (converted to the kernel's activation format, K padded)
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const int tok = tok_of[r];
      char* dst = xg + (long)r * Hp * esz;
      if (tok < 0) {
        std::memset(dst, 0, (size_t)Hp * esz);
        continue;
      }
      const char* src = (const char*)x + (long)tok * H * xsz;
      if (xsz == esz) {
        std::memcpy(dst, src, (size_t)H * esz);
      } else {  // bf16 -> f32
        const bf16_t* s = (const bf16_t*)src;
        float* d = (float*)dst;
        for (int c = 0; c < H; ++c) d[c] = bf16_to_f32(s[c]);
      }
      std::memset(dst + (long)H * esz, 0, (size_t)(Hp - H) * esz);
      if (fp8x && xf1[r] != 0.f) xf1[r] = fp8x_scale_row((bf16_t*)dst, H);
    }
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) std::memset(out + (long)n * Hp, 0, sizeof(float) * Hp);

    // ---- phase 1: h = silu(x Wg^T) * (x Wu^T), items = (expert, 16-row tile of I)
    {
      std::vector<float> G(16 * 16 * 4), U(16 * 16 * 4);
      // FP8: this thread's bf16 copies of the tiles it works on (gate, up / down)
      std::vector<bf16_t> Tg(fp8 ? 16L * std::max(Hp, Ip) + 32 : 0), Tu(fp8 ? 16L * Hp + 32 : 0);
#pragma omp for schedule(dynamic, 1)
      for (int item = 0; item < n_items1; ++item) {
        const int j = item / it, tile = item % it;
        const int e = active[j];
        const int r0 = row_off[j], m = count[e];
        const bool ea = amx && m >= amx_min;
        const char* wg = GU + (e * gu_expert + (2L * tile) * gu_tile) * wsz;
        const char* wu = wg + gu_tile * wsz;
        const char* X = xg + (long)r0 * Hp * esz;
        const int mp = ea ? (m + 15) / 16 * 16 : m;
        // FP8 tiles of one token block go through the fused kernel, others are converted
        const bool fused = fp8 && (fp8_fused || fp8f) && !ea && mp <= 16;
        const float *sg = nullptr, *su = nullptr;
        if (fp8) {
          const int rb = std::min(tile * 16 / bo, gu_rb - 1);  // (padding rows: zeros)
          sg = gus + (((long)e * 2 + 0) * gu_rb + rb) * gu_cb;
          su = gus + (((long)e * 2 + 1) * gu_rb + rb) * gu_cb;
        }
        if (fp8 && !fused) {
          fp8_tile((const uint8_t*)wg, Hp, sg, bi, gu_cb, Tg.data(), isa);
          fp8_tile((const uint8_t*)wu, Hp, su, bi, gu_cb, Tu.data(), isa);
          wg = (const char*)Tg.data();
          wu = (const char*)Tu.data();
        }
        for (int t0 = 0; t0 < mp; t0 += 16) {
          const int mt = std::min(16, mp - t0);
#ifdef WS_X86
          if (fused && fp8f) {
            fp8f_tokens(mt, (const uint8_t*)wg, Hp, (const float*)X, Hp, sg, bi, gu_cb, G.data());
            fp8f_tokens(mt, (const uint8_t*)wu, Hp, (const float*)X, Hp, su, bi, gu_cb, U.data());
          } else if (fused && fp8x) {
            const uint64_t* mg = gum + ((long)(e * it + tile) * 2) * gu_nw;
            fp8x_tokens(mt, (const uint8_t*)wg, Hp, (const bf16_t*)X, Hp, sg, bi, gu_cb, mg,
                        xf1 + r0, G.data());
            fp8x_tokens(mt, (const uint8_t*)wu, Hp, (const bf16_t*)X, Hp, su, bi, gu_cb,
                        mg + gu_nw, xf1 + r0, U.data());
          } else if (fused) {
            T_FP8_512BF[mt]((const uint8_t*)wg, Hp, (const bf16_t*)X, Hp, sg, bi, gu_cb, G.data());
            T_FP8_512BF[mt]((const uint8_t*)wu, Hp, (const bf16_t*)X, Hp, su, bi, gu_cb, U.data());
          } else if (ea) {
            amx_gate_up((const bf16_t*)wg, (const bf16_t*)wu, Hp,
                        (const bf16_t*)(X + (long)t0 * Hp * esz), Hp, G.data(), U.data());
          } else
#endif
          {
            tile_tokens(sel, wg, Hp, X + (long)t0 * Hp * esz, Hp, esz, mt, G.data());
            tile_tokens(sel, wu, Hp, X + (long)t0 * Hp * esz, Hp, esz, mt, U.data());
          }
          for (int t = 0; t < mt; ++t) {
            char* hrow = hb + ((long)(r0 + t0 + t) * Ip + tile * 16) * esz;
            for (int r = 0; r < 16; ++r) {
              float v = silu(G[t * 16 + r]) * U[t * 16 + r];
              if (cdtype == W_BF16) {
                const bf16_t b = f32_to_bf16(v);
                if (act_bf16)
                  ((bf16_t*)hrow)[r] = b;
                else
                  ((float*)hrow)[r] = bf16_to_f32(b);
              } else {
                ((float*)hrow)[r] = v;
              }
            }
          }
        }
      }
      // (implicit barrier: phase 2 needs every h row)
      if (fp8x) {  // the down projection's rows of the fused kernel, scaled as x's were
#pragma omp for schedule(static)
        for (int r = 0; r < rows; ++r)
          if (xf1[r] != 0.f) xf2[r] = fp8x_scale_row((bf16_t*)(hb + (long)r * Ip * esz), Ip);
      }

      // ---- phase 2: out[tok] += w * (h Wd^T), items = 16-column tiles of the output
#pragma omp for schedule(dynamic, 1)
      for (int c = 0; c < ht; ++c) {
        for (int j = 0; j < nact; ++j) {
          const int e = active[j];
          const int r0 = row_off[j], m = count[e];
          const bool ea = amx && m >= amx_min;
          const char* wd = DN + (e * dn_expert + (long)c * dn_tile) * wsz;
          const char* X = hb + (long)r0 * Ip * esz;
          const int mp = ea ? (m + 15) / 16 * 16 : m;
          const bool fused = fp8 && (fp8_fused || fp8f) && !ea && mp <= 16;
          const float* sd =
              fp8 ? dns + ((long)e * dn_rb + std::min(c * 16 / bo, dn_rb - 1)) * dn_cb : nullptr;
          if (fp8 && !fused) {
            fp8_tile((const uint8_t*)wd, Ip, sd, bi, dn_cb, Tg.data(), isa);
            wd = (const char*)Tg.data();
          }
          for (int t0 = 0; t0 < mp; t0 += 16) {
            const int mt = std::min(16, mp - t0);
#ifdef WS_X86
            if (fused && fp8f)
              fp8f_tokens(mt, (const uint8_t*)wd, Ip, (const float*)X, Ip, sd, bi, dn_cb, G.data());
            else if (fused && fp8x)
              fp8x_tokens(mt, (const uint8_t*)wd, Ip, (const bf16_t*)X, Ip, sd, bi, dn_cb,
                          dnm + ((long)e * ht + c) * dn_nw, xf2 + r0, G.data());
            else if (fused)
              T_FP8_512BF[mt]((const uint8_t*)wd, Ip, (const bf16_t*)X, Ip, sd, bi, dn_cb, G.data());
            else if (ea)
              amx_tile((const bf16_t*)wd, Ip, (const bf16_t*)(X + (long)t0 * Ip * esz), Ip, G.data());
            else
#endif
              tile_tokens(sel, wd, Ip, X + (long)t0 * Ip * esz, Ip, esz, mt, G.data());
            for (int t = 0; t < mt; ++t) {
              const int tok = tok_of[r0 + t0 + t];
              if (tok < 0) continue;
              const float w = wt_of[r0 + t0 + t];
              float* o = out + (long)tok * Hp + c * 16;
              for (int r = 0; r < 16; ++r) o[r] += w * G[t * 16 + r];
            }
          }
        }
      }
    }
#ifdef WS_X86
    if (amx) amx_thread_release();
#endif
  }
  return 0;
}

// One ws_moe_forward call as a job a native queue runs with no interpreter in the way (the CPU
// attention library's ws_queue_submit_fn): the kernel into `out` ([N][Hp] fp32 scratch), then
// the result's [N][H] rows into `res` as bf16 (res_dtype 0, rounded to nearest even, as torch
// rounds) or fp32 (1) -- a pinned buffer the device copies from once the job's flag is up.
struct WsMoeJob {
  const void* gu;
  const void* down;
  int32_t wdtype, E, H, I, Hp, Ip;
  const void* x;
  int32_t N;
  const int32_t* ids;
  const float* tw;
  int32_t k;
  float* out;
  void* res;
  int32_t res_dtype, isa, amx_min, nthreads;
  const float* gus;  // FP8 scales (W_FP8 only)
  const float* dns;
  int32_t bo, bi;
  const uint64_t* gum;  // FP8 line masks (null: the converted tiles' products)
  const uint64_t* dnm;
};

extern "C" int ws_moe_job(void* arg) {
  const WsMoeJob& j = *(const WsMoeJob*)arg;
  if (j.res_dtype != 0 && j.res_dtype != 1) return -2;
  const int rc = ws_moe_forward(j.gu, j.down, j.wdtype, j.E, j.H, j.I, j.Hp, j.Ip, j.x, j.N,
                                j.ids, j.tw, j.k, j.out, j.isa, j.amx_min, j.nthreads, j.gus,
                                j.dns, j.bo, j.bi, j.gum, j.dnm);
  if (rc != 0) return rc;
  for (long n = 0; n < j.N; ++n) {
    const float* o = j.out + n * j.Hp;
    if (j.res_dtype == 0) {
      bf16_t* r = (bf16_t*)j.res + n * j.H;
      for (int h = 0; h < j.H; ++h) r[h] = f32_to_bf16(o[h]);
    } else {
      std::memcpy((float*)j.res + n * j.H, o, sizeof(float) * (size_t)j.H);
    }
  }
  return 0;
}

// One packed FP8 tile ([Kp/2][16][2] bytes, scales srow[nb]) to bf16 with the code path of `isa`
// (the kernel's own conversion, exported so that tests can check it value by value).
extern "C" int ws_fp8_tile_to_bf16(const uint8_t* W, int Kp, const float* srow, int bk, int nb,
                                   uint16_t* dst, int isa) {
  if (Kp % 2 || bk <= 0 || bk % 2 || nb <= 0) return -2;
  const int detected = ws_detect_isa();
  fp8_tile(W, Kp, srow, bk, nb, dst, std::min(isa, detected));
  return 0;
}

// The exact-products FP8 kernel's line masks (k_fp8x_avx512bf16): for each of `ntiles` packed
// tiles ([Kp/2 lines][32 bytes]), ceil(Kp / 128) words; bit l of word c is set when line
// 64c + l holds a nonzero e4m3 subnormal code (exponent field 0, mantissa not 0). Eight bytes at
// a time: per byte, (b & 0x78) + 0x78 has bit 7 clear only for exponent 0, and (b & 0x07) + 0x7F
// has it set only for a nonzero mantissa (no carry leaves a byte). Returns the lines flagged.
extern "C" long ws_fp8_line_masks(const uint8_t* W, long ntiles, int Kp, uint64_t* out,
                                  int nthreads) {
  if (Kp <= 0 || Kp % 2 || ntiles < 0) return -2;
  const int lines = Kp / 2, nw = (lines + 63) / 64;
  const uint64_t e = 0x7878787878787878ull, m = 0x0707070707070707ull, h = 0x8080808080808080ull;
  long flagged = 0;
#pragma omp parallel for num_threads(std::max(1, nthreads)) schedule(static) reduction(+ : flagged)
  for (long t = 0; t < ntiles; ++t) {
    const uint8_t* tile = W + t * 32L * lines;
    uint64_t* o = out + t * nw;
    for (int c = 0; c < nw; ++c) o[c] = 0;
    for (int l = 0; l < lines; ++l) {
      uint64_t any = 0;
      for (int q = 0; q < 4; ++q) {
        uint64_t v;
        std::memcpy(&v, tile + 32L * l + 8 * q, 8);
        any |= ~((v & e) + e) & ((v & m) + 0x7F7F7F7F7F7F7F7Full) & h;
      }
      if (any) { o[l >> 6] |= 1ull << (l & 63); ++flagged; }
    }
  }
  return flagged;
}

// Multi-threaded read of a buffer (DRAM read-bandwidth probe for the benchmark).
extern "C" double ws_read_sum(const void* p, long bytes, int nthreads) {
  const uint64_t* w = (const uint64_t*)p;
  const long n = bytes / 8;
  uint64_t acc = 0;
#pragma omp parallel for num_threads(nthreads) reduction(^ : acc) schedule(static)
  for (long i = 0; i < n; i += 8) {
    uint64_t a = 0;
    const long end = std::min(n, i + 8);
    for (long q = i; q < end; ++q) a ^= w[q];
    acc ^= a;
  }
  return (double)(acc & 0xffff);
}

// Seeded random weights for benchmarks: out[i] = std * z_i in bf16, z_i an approximately standard
// normal value (the sum of four 16-bit uniforms from one splitmix64 output, centred and scaled:
// Irwin-Hall, bounded at +-3.46). Counter-based, so the values depend on (seed, i) only; one
// value costs a few integer operations instead of torch's Box-Muller (~0.2 G values/s a core),
// so Mixtral-8x7B's 45 G expert values are drawn in seconds, not minutes.
extern "C" void ws_random_normal_bf16(uint16_t* out, long n, unsigned long long seed, float std) {
  const float scale = std * 1.7320508075688772f / 65536.0f;
  const uint64_t golden = 0x9E3779B97F4A7C15ull;
  for (long i = 0; i < n; ++i) {
    uint64_t z = (uint64_t)seed + (uint64_t)(i + 1) * golden;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const uint32_t s = (uint32_t)(z & 0xffff) + (uint32_t)((z >> 16) & 0xffff) +
                       (uint32_t)((z >> 32) & 0xffff) + (uint32_t)(z >> 48);
    const float x = ((float)s - 131070.0f) * scale;
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    out[i] = (uint16_t)(u >> 16);
  }
}
