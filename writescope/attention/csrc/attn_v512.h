// SIMD traits for AVX-512 (16 fp32 lanes); included inside an anonymous namespace.
struct V {
    static constexpr int W = 16;
    typedef __m512 vec;
    static inline vec zero() { return _mm512_setzero_ps(); }
    static inline vec set1(float x) { return _mm512_set1_ps(x); }
    static inline vec loadf(const float* p) { return _mm512_loadu_ps(p); }
    static inline vec load(const float* p) { return _mm512_loadu_ps(p); }
    static inline vec load(const uint16_t* p) {
        __m256i x = _mm256_loadu_si256((const __m256i*)p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
    static inline void storef(float* p, vec v) { _mm512_storeu_ps(p, v); }
    static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
    static inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
    static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
    static inline vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
    static inline vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
    static inline vec bcast2(const float* p) {
        double d;
        __builtin_memcpy(&d, p, 8);
        return _mm512_castpd_ps(_mm512_set1_pd(d));
    }
    static inline __m256 lo(vec v) { return _mm512_castps512_ps256(v); }
    static inline __m256 hi(vec v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
    static inline void hpair(vec v, float* out) {
        __m256 h = _mm256_add_ps(lo(v), hi(v));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_storel_pi((__m64*)out, s);
    }
    static inline float hsum(vec v) { return _mm512_reduce_add_ps(v); }
    static inline float hmax(vec v) { return _mm512_reduce_max_ps(v); }
    static inline vec exp2(vec x) {
        x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
        vec n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        vec f = _mm512_sub_ps(x, n);
        vec p = _mm512_set1_ps(1.525273380405984e-05f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
        __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
        return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    }
};

// 2^x for the softmax: round-to-nearest split, a degree-4 minimax polynomial on [-1/2, 1/2]
// (relative error 2.9e-6, far below the bf16 rounding of P that follows; its constant term is
// exactly 1, so 2^0 = 1 and an unmoved max keeps the P.V accumulate path) and VSCALEFPS for the
// exponent: 8 instructions where V::exp2 (degree 7, exponent built by integer ops) takes 14.
static inline __m512 exp2_fast(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.582852944731712e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5906426161527634e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4024099111557007e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931241750717163e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
