// AVX2 + FMA build of the generic kernel (8 fp32 lanes; bf16 KV takes the even/odd form of
// attn_evenodd.h). Compiled for this ISA by the pragma below whatever the global flags, and
// only called after a cpuid check (attn_ops.cpp).
#pragma GCC target("avx2,fma,f16c")
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct V {
    static constexpr int W = 8;
    typedef __m256 vec;
    static inline vec zero() { return _mm256_setzero_ps(); }
    static inline vec set1(float x) { return _mm256_set1_ps(x); }
    static inline vec loadf(const float* p) { return _mm256_loadu_ps(p); }
    static inline vec load(const float* p) { return _mm256_loadu_ps(p); }
    static inline vec load(const uint16_t* p) {
        __m128i x = _mm_loadu_si128((const __m128i*)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    static inline void storef(float* p, vec v) { _mm256_storeu_ps(p, v); }
    static inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
    static inline vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
    static inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
    static inline vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
    static inline vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
    // keeps v in a register: the compiler would fold its load into each FMA that uses it
    static inline void pin(vec& v) { __asm__("" : "+x"(v)); }
    static inline vec bcast1(const float* p) { return _mm256_broadcast_ss(p); }
    // the 16 bf16 values at p as fp32: even-index values in e, odd-index ones in o
    static inline void load_eo(const uint16_t* p, vec& e, vec& o) {
        __m256i x = _mm256_loadu_si256((const __m256i*)p);
        e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
    }
    // out[i] = the sum of v[i]'s lanes, i < 8 (out 32-byte aligned)
    static inline void reduce8(const vec* v, float* out) {
        vec t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
        vec t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
        _mm256_store_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                                           _mm256_permute2f128_ps(t0, t1, 0x31)));
    }
    static inline vec bcast2(const float* p) {
        return _mm256_castpd_ps(_mm256_broadcast_sd((const double*)p));
    }
    // out[0] = sum of even lanes, out[1] = sum of odd lanes
    static inline void hpair(vec v, float* out) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_storel_pi((__m64*)out, s);
    }
    static inline float hsum(vec v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static inline float hmax(vec v) {
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    // 2^x for x <= 0 (x = -inf gives 0): 2^round(x) * poly(frac), |rel err| < 1e-7
    static inline vec exp2(vec x) {
        x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
        vec n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        vec f = _mm256_sub_ps(x, n);
        vec p = _mm256_set1_ps(1.525273380405984e-05f);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    }
};

#include "attn_impl.h"
#include "attn_evenodd.h"

}  // namespace

void ws_item_avx2(const WsArgs* a, const WsItem* it) {
    if (ws_evenodd_eligible(a)) ws_item_evenodd(a, it);
    else ws_item_dispatch(a, it);
}
