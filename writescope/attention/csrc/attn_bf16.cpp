// AVX-512 BF16 build: both products of a block as VDPBF16PS dot products (bf16 pairs summed
// into fp32 lanes), for CPUs with AVX512_BF16 and no AMX (AMD Zen 4/5, Intel Cooper Lake), and
// as a variant elsewhere. Queries and probabilities are rounded to bf16, as GPU flash
// attention does; accumulation is fp32.
//
// The C layout's token pairs ([bs/2][R][2]) are the operand format of VDPBF16PS for P.V:
//   O[d] += p[t] v[t][d] + p[t+1] v[t+1][d]  -- one instruction per 16 dims of a token pair,
//   the pair (p[t], p[t+1]) broadcast as one 32-bit value.
// For Q.K the sum runs over dims, so one VPERMW turns a loaded token pair (16 dims x 2 tokens,
// interleaved) into [token t: 16 dims | token t+1: 16 dims]; a query vector holding the same 16
// dims in both halves then gives token t's partial score in lanes 0-7 and token t+1's in lanes
// 8-15. Every K/V vector is loaded and permuted once and used by all M query vectors.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

#include "attn_v512.h"
#include "attn_impl.h"

static inline uint16_t f2bf(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// scores of token pair `k2` (interleaved [R][2], K part from dim 0) for MB query rows
template <int MB>
static inline void qk_pair(const uint16_t* __restrict k2, const uint16_t* __restrict qb, int64_t qst,
                           int nK, __m512i perm, float* __restrict s, int64_t sst) {
    __m512 acc[MB];
    for (int r = 0; r < MB; ++r) acc[r] = _mm512_setzero_ps();
    for (int c = 0; c < nK; ++c) {
        __m512i kv = _mm512_permutexvar_epi16(perm, _mm512_loadu_si512((const void*)(k2 + 32 * c)));
        for (int r = 0; r < MB; ++r)
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)kv,
                                      (__m512bh)_mm512_loadu_si512((const void*)(qb + r * qst + 32 * c)));
    }
    for (int r = 0; r < MB; ++r) {
        __m256 lo = _mm512_castps512_ps256(acc[r]);
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1));
        // two horizontal sums at once: [lo0+lo1 .. | hi0+hi1 ..] then fold
        __m256 t = _mm256_hadd_ps(lo, hi);            // lo pairs | hi pairs, per 128-bit lane
        t = _mm256_hadd_ps(t, t);                     // [l01+l23, h01+h23, ..] per lane
        __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        s[r * sst] = _mm_cvtss_f32(u);
        s[r * sst + 1] = _mm_cvtss_f32(_mm_shuffle_ps(u, u, 1));
    }
}

// two token pairs at once: each query chunk is loaded once for both
template <int MB>
static inline void qk_pair2(const uint16_t* __restrict k2a, const uint16_t* __restrict k2b,
                            const uint16_t* __restrict qb, int64_t qst, int nK, __m512i perm,
                            float* __restrict s, int64_t sst) {
    __m512 acc[MB][2];
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int c = 0; c < nK; ++c) {
        __m512i ka = _mm512_permutexvar_epi16(perm, _mm512_loadu_si512((const void*)(k2a + 32 * c)));
        __m512i kb = _mm512_permutexvar_epi16(perm, _mm512_loadu_si512((const void*)(k2b + 32 * c)));
        for (int r = 0; r < MB; ++r) {
            __m512bh qv = (__m512bh)_mm512_loadu_si512((const void*)(qb + r * qst + 32 * c));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)ka, qv);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)kb, qv);
        }
    }
    for (int r = 0; r < MB; ++r) {
        // [a.lo | a.hi] and [b.lo | b.hi] -> four sums with one pass
        __m512 x = _mm512_add_ps(_mm512_shuffle_ps(acc[r][0], acc[r][1], 0x88),
                                 _mm512_shuffle_ps(acc[r][0], acc[r][1], 0xDD));
        // per 128-bit lane k: [a(4k)+a(4k+1), a(4k+2)+a(4k+3), b.., b..]
        __m256 lo = _mm512_castps512_ps256(x);
        __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
        // lanes 0,1 (lo) are token-pair a's/b's first token; lanes 2,3 (hi) the second
        __m128 l = _mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
        // l = [a0 part, a0 part, b0 part, b0 part] summed over lanes 0-7; h likewise for tokens 1
        __m128 t = _mm_hadd_ps(l, h);  // [a_t0, b_t0, a_t1, b_t1]
        float* o = s + r * sst;
        o[0] = _mm_cvtss_f32(t);
        o[1] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 2));
        o[2] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
        o[3] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 3));
    }
}

// O[r][16c .. 16c+31] += sum over pairs of V pair . P pair, MB rows, two 16-dim chunks
template <int MB, int NC>
static inline void pv_rows(const uint16_t* __restrict v2, int64_t pstride, int np,
                           const uint32_t* __restrict pb, int64_t pst, float* __restrict o, int64_t ost) {
    __m512 acc[MB][NC];
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_loadu_ps(o + r * ost + 16 * j);
    for (int p = 0; p < np; ++p) {
        __m512i v[NC];
        for (int j = 0; j < NC; ++j) v[j] = _mm512_loadu_si512((const void*)(v2 + p * pstride + 32 * j));
        for (int r = 0; r < MB; ++r) {
            __m512i w = _mm512_set1_epi32((int)pb[r * pst + p]);
            for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)v[j], (__m512bh)w);
        }
    }
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < NC; ++j) _mm512_storeu_ps(o + r * ost + 16 * j, acc[r][j]);
}

template <int NC>
static void pv_all(const uint16_t* v2, int64_t pstride, int np, const uint32_t* pb, int64_t pst,
                   float* o, int64_t ost, int M) {
    int r = 0;
    for (; r + 8 <= M; r += 8) pv_rows<8, NC>(v2, pstride, np, pb + r * pst, pst, o + r * ost, ost);
    for (; r + 4 <= M; r += 4) pv_rows<4, NC>(v2, pstride, np, pb + r * pst, pst, o + r * ost, ost);
    for (; r < M; ++r) pv_rows<1, NC>(v2, pstride, np, pb + r * pst, pst, o + r * ost, ost);
}

static void bf16_item(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dk = a->Dk, Dv = a->Dv;
    const int nK = Dk / 16, nV = Dv / 16;
    const int bsp = (int)ws_round_up(bs, 2);
    const int spad = (int)ws_round_up(bsp, 32);  // P is converted 32 at a time
    const int64_t qst = 32 * (int64_t)nK, sst = spad, pst = spad / 2, ost = Dv;
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    size_t oq = take(2 * (size_t)M * qst), os = take(4 * (size_t)M * sst), op = take(4 * (size_t)M * pst);
    size_t oo = take(4 * (size_t)M * ost), om = take(4 * 3 * (size_t)M), ot = take(2 * (size_t)bsp * R);
    char* base = ws_scratch(off);
    uint16_t* Qb = (uint16_t*)(base + oq);
    float* S = (float*)(base + os);
    uint32_t* Pb = (uint32_t*)(base + op);
    float* O = (float*)(base + oo);
    float* mrun = (float*)(base + om);
    float* lrun = mrun + M;
    float* alpha = lrun + M;
    uint16_t* tilebuf = (uint16_t*)(base + ot);

    // queries: per row and 16-dim chunk, the 16 dims (bf16) twice
    for (int r = 0; r < M; ++r) {
        const float* q = it->q + (int64_t)r * Dk;
        uint16_t* d = Qb + r * qst;
        for (int c = 0; c < nK; ++c)
            for (int i = 0; i < 16; ++i) d[32 * c + i] = d[32 * c + 16 + i] = f2bf(q[16 * c + i]);
        mrun[r] = -INFINITY;
        lrun[r] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)M * ost);
    alignas(64) uint16_t pidx[32];
    for (int j = 0; j < 16; ++j) { pidx[j] = (uint16_t)(2 * j); pidx[16 + j] = (uint16_t)(2 * j + 1); }
    const __m512i perm = _mm512_loadu_si512((const void*)pidx);

    for (int bi = 0; bi < it->nblocks; ++bi) {
        const int n = it->lens[bi];
        if (n <= 0) continue;
        WsPf pf;
        const uint16_t* tile = ws_block_tile<uint16_t>(a, it, bi, n, bsp, tilebuf, pf);
        const int np = (n + 1) / 2;
        const int64_t pf_k = (pf.total + np - 1) / np;
        int p = 0;
        for (; p + 2 <= np; p += 2) {
            ws_pf_step(pf, 2 * pf_k);
            const uint16_t* k2 = tile + ((int64_t)p * R + a->k_off) * 2;
            const uint16_t* k2b = k2 + 2 * (int64_t)R;
            int r = 0;
            for (; r + 8 <= M; r += 8) qk_pair2<8>(k2, k2b, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
            for (; r + 4 <= M; r += 4) qk_pair2<4>(k2, k2b, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
            for (; r < M; ++r) qk_pair2<1>(k2, k2b, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
        }
        for (; p < np; ++p) {
            ws_pf_step(pf, pf_k);
            const uint16_t* k2 = tile + ((int64_t)p * R + a->k_off) * 2;
            int r = 0;
            for (; r + 8 <= M; r += 8) qk_pair<8>(k2, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
            for (; r + 4 <= M; r += 4) qk_pair<4>(k2, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
            for (; r < M; ++r) qk_pair<1>(k2, Qb + r * qst, qst, nK, perm, S + r * sst + 2 * p, sst);
        }
        ws_softmax_block(M, n, spad, S, sst, mrun, lrun, alpha);  // P (fp32, 0 past n) in S
        for (int r = 0; r < M; ++r) {
            float* s = S + r * sst;
            uint32_t* pb = Pb + r * pst;
            for (int t = 0; t < spad; t += 32)
                _mm512_storeu_si512((void*)(pb + t / 2),
                                    (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + t + 16), _mm512_loadu_ps(s + t)));
            if (alpha[r] != 1.0f) {
                __m512 al = _mm512_set1_ps(alpha[r]);
                float* o = O + r * ost;
                for (int c = 0; c < Dv; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), al));
            }
        }
        const uint16_t* v2 = tile + (int64_t)a->v_off * 2;
        int c = 0;
        for (; c + 2 <= nV; c += 2) pv_all<2>(v2 + 32 * c, 2 * (int64_t)R, np, Pb, pst, O + 16 * c, ost, M);
        for (; c < nV; ++c) pv_all<1>(v2 + 32 * c, 2 * (int64_t)R, np, Pb, pst, O + 16 * c, ost, M);
    }
    for (int r = 0; r < M; ++r) {
        memcpy(it->o + (int64_t)r * Dv, O + r * ost, sizeof(float) * Dv);
        it->m[r] = mrun[r];
        it->l[r] = lrun[r];
    }
}

}  // namespace

int ws_bf16_eligible(const WsArgs* a) {
    return a->dtype == 1 && a->Dk % 16 == 0 && a->Dv % 16 == 0 && a->k_off % 16 == 0 &&
           a->v_off % 16 == 0;
}

void ws_item_avx512bf16(const WsArgs* a, const WsItem* it) {
    if (ws_bf16_eligible(a)) bf16_item(a, it);
    else ws_item_dispatch(a, it);
}
