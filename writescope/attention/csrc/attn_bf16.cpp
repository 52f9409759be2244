// AVX-512 BF16 build: both products of a block as VDPBF16PS dot products (bf16 pairs summed
// into fp32 lanes), for CPUs with AVX512_BF16 and no AMX (AMD Zen 4/5, Intel Cooper Lake), and
// as a variant elsewhere. Queries and probabilities are rounded to bf16, as GPU flash
// attention does; accumulation is fp32.
//
// T blocks (the GPU layout, token-major records) are read in place: see bf16_item at the end.
// The C layout's token pairs ([bs/2][R][2]) are the operand format of VDPBF16PS for P.V:
//   O[d] += p[t] v[t][d] + p[t+1] v[t+1][d]  -- one instruction per 16 dims of a token pair,
//   the pair (p[t], p[t+1]) broadcast as one 32-bit value.
// For Q.K the sum runs over dims, so one VPERMW turns a loaded token pair (16 dims x 2 tokens,
// interleaved) into [token t: 16 dims | token t+1: 16 dims]; a query vector holding the same 16
// dims in both halves then gives token t's partial score in lanes 0-7 and token t+1's in lanes
// 8-15. Every K/V vector is loaded and permuted once and used by up to 16 query vectors.
// Rows go in chunks of up to 16. Sixteen accumulators (16 rows x 1 pair, 8 x 2, 4 x 4) are
// reduced together (sum_halves16: 14 shuffle-and-adds for 32 scores) into token-major scores,
// so the online softmax is vertical (softmax_tm) and writes P straight into the pairs P.V
// broadcasts. On the 2-core Zen 5 dev VM (2 VDPBF16PS a cycle) this is 1.1-1.3x the per-row
// reductions it replaced in cache (GQA group 8, MLA at 32 rows; MLA at 16 rows unchanged).
// The next block is prefetched into L2 over this block's Q.K and P.V pair steps, in proportion
// to their products: prefetching it during Q.K alone left P.V without a stream (dev VM, two
// threads from DRAM: GQA 1.0-1.15x, MLA 1.12-1.15x, one thread GQA 1.3x over Q.K alone),
// and into L1 rather than L2 (PREFETCHT0: 0.999-1.11x, 21 of 22 shape ratios above 1.01, in
// four bench.cpu_ab runs on the Zen 5 dev VM, two threads; the AMX kernel keeps L2: the H200
// host, where it runs, was not compared).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

// The software prefetch's level: L1 here; attn_bf16_l2.cpp builds this file again with L2
// (the variant "avx512bf16-l2": which is faster depends on the core, `writescope calibrate`
// times both).
#ifndef WS_BF16_PF_HINT
#define WS_BF16_PF_HINT _MM_HINT_T0
#endif
#define WS_PF_HINT WS_BF16_PF_HINT
#include "attn_v512.h"
#include "attn_impl.h"

static inline uint16_t f2bf(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// The sums of the two 8-lane halves of 16 vectors (a[i]: lanes 0-7 partial sums of one token's
// score, lanes 8-15 the next token's), in three shuffle-and-add stages (14 of them for 32 sums,
// instead of a horizontal reduction per vector):
//   v[0] = [lo of a0..a3 | hi of a0..a3 | lo of a4..a7 | hi of a4..a7], v[1] the same of a8..a15.
static inline void sum_halves16(const __m512* a, __m512* v) {
    __m512 z[8], w[4];
    for (int i = 0; i < 8; ++i)
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x88), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 4; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0x88), _mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of NP consecutive token pairs (k2: the first pair's K, pairs `pst2` elements apart) for
// MB query rows (MB * NP <= 16; row r's 16-dim chunk c at qb + 32 (16 c + r), the 16 dims
// twice), written token-major: slot t of the pairs at s + t * SS (SS = MB, or 16 for the two
// 8-row halves of a 16-row chunk), rows in order.
// TL (the GPU layout read in place, T blocks): `tk` holds the 2 NP tokens' K instead; a token
// pair's 16 dims are then two 32-byte loads put side by side, already in the order the permute
// makes of a C-layout pair.
template <int MB, int NP, int SS = MB, bool TL = false>
static inline void qk_tm(const uint16_t* __restrict k2, int64_t pst2, const uint16_t* __restrict qb,
                         int nK, __m512i perm, float* __restrict s,
                         const uint16_t* const* tk = nullptr) {
    static_assert(MB * NP <= 16, "16 accumulators");
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int c = 0; c < nK; ++c) {
        __m512i kv[NP];
        for (int j = 0; j < NP; ++j) {
            if constexpr (TL)
                kv[j] = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(tk[2 * j] + 16 * c))),
                    _mm256_loadu_si256((const __m256i*)(tk[2 * j + 1] + 16 * c)), 1);
            else
                kv[j] = _mm512_permutexvar_epi16(perm, _mm512_loadu_si512((const void*)(k2 + j * pst2 + 32 * c)));
        }
        for (int r = 0; r < MB; ++r) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512((const void*)(qb + 32 * (16 * c + r)));
            for (int j = 0; j < NP; ++j) acc[j * MB + r] = _mm512_dpbf16_ps(acc[j * MB + r], (__m512bh)kv[j], qv);
        }
    }
    __m512 v[2];
    sum_halves16(acc, v);
    if (MB == 16) {  // v0: rows 0-7 as [t0 r0-3 | t1 r0-3 | t0 r4-7 | t1 r4-7], v1: rows 8-15
        _mm512_storeu_ps(s, _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_storeu_ps(s + 16, _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    } else if (MB == 8) {  // v[j]: pair j as [t0 r0-3 | t1 r0-3 | t0 r4-7 | t1 r4-7]
        for (int j = 0; j < NP; ++j) {
            const __m512 x = _mm512_shuffle_f32x4(v[j], v[j], _MM_SHUFFLE(3, 1, 2, 0));
            if (SS == 8) {
                _mm512_storeu_ps(s + 16 * j, x);
            } else {
                _mm256_storeu_ps(s + 2 * j * SS, _mm512_castps512_ps256(x));
                _mm256_storeu_ps(s + (2 * j + 1) * SS, _mm512_extractf32x8_ps(x, 1));
            }
        }
    } else {  // MB == 4: v[0] pairs 0-1, v[1] pairs 2-3, already slot after slot
        if (NP == 1) _mm256_storeu_ps(s, _mm512_castps512_ps256(v[0]));
        else _mm512_storeu_ps(s, v[0]);
        if (NP == 4) _mm512_storeu_ps(s + 16, v[1]);
    }
}

// One 16-row chunk's online-softmax step over a block: S holds `n` valid token slots of Ms
// floats (Ms in {4, 8, 16}: the chunk's rows rounded up), 16 / Ms slots per vector. Writes the
// probabilities as bf16 pairs, dword (P[2p][r], P[2p+1][r]) at Pp + p * Ms + r (the operand
// P.V broadcasts), updates the rows' running max and sum (16 floats each, rows >= Ms unused)
// and returns alpha = 2^(m_old - m_new) per row. All vertical: no horizontal reductions but
// one fold per block for the max and the sum.
struct SmIdx {
    int Ms;
    __m512i rowof;  // lane i -> row i % Ms
    __m512i pidx;   // dword d of a pair vector: words (2d, 2d+1) <- P of slot 2(d / Ms) and
                    // 2(d / Ms) + 1, row d % Ms (Ms = 16: of the two vectors' lane d)
};

static SmIdx sm_idx(int Ms) {
    SmIdx x;
    x.Ms = Ms;
    alignas(64) int32_t rix[16];
    alignas(64) uint16_t pix[32];
    for (int i = 0; i < 16; ++i) rix[i] = i % Ms;
    for (int d = 0; d < 16; ++d)
        for (int j = 0; j < 2; ++j)
            pix[2 * d + j] = (uint16_t)(Ms == 16 ? 16 * j + d : (2 * (d / Ms) + j) * Ms + d % Ms);
    x.rowof = _mm512_load_si512((const void*)rix);
    x.pidx = _mm512_load_si512((const void*)pix);
    return x;
}

// (always inlined: bf16_item_t's two forms would otherwise share one out-of-line copy, and the C
// layout's form would no longer be the code it was before the T form existed)
__attribute__((always_inline)) static inline void softmax_tm(const SmIdx& ix, int n, float* __restrict S,
                                                             uint32_t* __restrict Pp,
                       float* __restrict mrun, float* __restrict lrun, float* __restrict alpha) {
    const int Ms = ix.Ms;
    const int per = 16 / Ms;
    const int step = per > 2 ? per : 2;
    const int nsl = (n + step - 1) / step * step;  // whole vectors and whole pairs
    const float ninf = -INFINITY;
    for (int i = n * Ms; i < nsl * Ms; ++i) S[i] = ninf;
    const int nv = nsl * Ms / 16;
    const __m512i rowof = ix.rowof;
    auto fold_max = [&](__m512 x) {
        if (Ms <= 8) x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
        if (Ms <= 4) x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
        return x;
    };
    auto fold_add = [&](__m512 x) {
        if (Ms <= 8) x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
        if (Ms <= 4) x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
        return x;
    };
    __m512 mx[4] = {_mm512_set1_ps(ninf), _mm512_set1_ps(ninf), _mm512_set1_ps(ninf), _mm512_set1_ps(ninf)};
    int v = 0;
    for (; v + 4 <= nv; v += 4)
        for (int j = 0; j < 4; ++j) mx[j] = _mm512_max_ps(mx[j], _mm512_loadu_ps(S + 16 * (v + j)));
    for (; v < nv; ++v) mx[0] = _mm512_max_ps(mx[0], _mm512_loadu_ps(S + 16 * v));
    const __m512 bmax = fold_max(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
    const __m512 mold = _mm512_permutexvar_ps(rowof, _mm512_loadu_ps(mrun));
    const __m512 mnew = _mm512_max_ps(mold, bmax);
    const __mmask16 first = _mm512_cmp_ps_mask(mold, _mm512_set1_ps(ninf), _CMP_EQ_OQ);
    const __m512 al = _mm512_maskz_mov_ps((__mmask16)~first, exp2_fast(_mm512_sub_ps(mold, mnew)));
    const __m512i pidx = ix.pidx;
    __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const __m512 vninf = _mm512_set1_ps(ninf);
    auto prob = [&](int i) {
        const __m512 x = _mm512_loadu_ps(S + 16 * i);
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, vninf, _CMP_NEQ_OQ), exp2_fast(_mm512_sub_ps(x, mnew)));
    };
    if (Ms == 16) {
        for (int p = 0; p < nv / 2; ++p) {
            const __m512 e0 = prob(2 * p), e1 = prob(2 * p + 1);
            sum[0] = _mm512_add_ps(sum[0], e0);
            sum[1] = _mm512_add_ps(sum[1], e1);
            _mm512_storeu_si512((void*)(Pp + 16 * p), _mm512_permutexvar_epi16(pidx, (__m512i)_mm512_cvtne2ps_pbh(e1, e0)));
        }
    } else {  // one vector: 16 / Ms slots, i.e. 8 / Ms pairs, 8 dwords
        const __m256i pidx8 = _mm512_castsi512_si256(pidx);
        for (int i = 0; i < nv; ++i) {
            const __m512 e = prob(i);
            sum[i & 1] = _mm512_add_ps(sum[i & 1], e);
            _mm256_storeu_si256((__m256i*)(Pp + 8 * i), _mm256_permutexvar_epi16(pidx8, (__m256i)_mm512_cvtneps_pbh(e)));
        }
    }
    const __m512 bsum = fold_add(_mm512_add_ps(sum[0], sum[1]));
    _mm512_storeu_ps(lrun, _mm512_fmadd_ps(_mm512_permutexvar_ps(rowof, _mm512_loadu_ps(lrun)), al, bsum));
    _mm512_storeu_ps(mrun, mnew);
    _mm512_storeu_ps(alpha, al);
}

// O[r][16c .. 16c + 16 NC) += sum over pairs of V pair . P pair, MB rows; the P pair of row r and
// token pair p is the dword pb[r * pr + p * pp]; `pfk` lines of the prefetch `pf` per pair
// TL (the GPU layout read in place, T blocks; NC = 2): v2 is token 0's V, tokens `pstride`
// elements apart, `n` tokens; tokens t and t+1's 32 dims are two 64-byte loads that VPUNPCKLWD /
// VPUNPCKHWD interleave into the pairs VDPBF16PS takes -- in each 128-bit lane, dims 0-3 and
// 4-7 of that lane's 8, so the accumulators hold the 32 dims in that order (o[k], k < 16: dim
// 8 (k / 4) + k % 4; o[16 + k]: dim 8 (k / 4) + 4 + k % 4; o_natural puts them back). A missing
// second token (odd n) reads the first again: its probability is 0.
template <int MB, int NC, bool TL = false>
static inline void pv_rows(const uint16_t* __restrict v2, int64_t pstride, int np,
                           const uint32_t* __restrict pb, int64_t pr, int64_t pp, float* __restrict o,
                           int64_t ost, WsPf& pf, int64_t pfk, int n = 0) {
    static_assert(!TL || NC == 2, "the GPU layout's pairs come 32 dims at a time");
    __m512 acc[MB][NC];
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_loadu_ps(o + r * ost + 16 * j);
    for (int p = 0; p < np; ++p) {
        ws_pf_step(pf, pfk);
        __m512i v[NC];
        if constexpr (TL) {
            const uint16_t* r0 = v2 + (int64_t)(2 * p) * pstride;
            const uint16_t* r1 = 2 * p + 1 < n ? r0 + pstride : r0;
            const __m512i x = _mm512_loadu_si512((const void*)r0), y = _mm512_loadu_si512((const void*)r1);
            v[0] = _mm512_unpacklo_epi16(x, y);
            v[NC - 1] = _mm512_unpackhi_epi16(x, y);
        } else {
            for (int j = 0; j < NC; ++j) v[j] = _mm512_loadu_si512((const void*)(v2 + p * pstride + 32 * j));
        }
        for (int r = 0; r < MB; ++r) {
            __m512i w = _mm512_set1_epi32((int)pb[r * pr + p * pp]);
            for (int j = 0; j < NC; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)v[j], (__m512bh)w);
        }
    }
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < NC; ++j) _mm512_storeu_ps(o + r * ost + 16 * j, acc[r][j]);
}

// all M rows; the prefetch advances `pfk` lines per pair of the first row group
template <int NC, bool TL = false>
static void pv_all(const uint16_t* v2, int64_t pstride, int np, const uint32_t* pb, int64_t pp,
                   float* o, int64_t ost, int M, WsPf& pf, int64_t pfk, int n = 0) {
    int r = 0;
    for (; r + 8 <= M; r += 8, pfk = 0) pv_rows<8, NC, TL>(v2, pstride, np, pb + r, 1, pp, o + r * ost, ost, pf, pfk, n);
    for (; r + 4 <= M; r += 4, pfk = 0) pv_rows<4, NC, TL>(v2, pstride, np, pb + r, 1, pp, o + r * ost, ost, pf, pfk, n);
    for (; r < M; ++r, pfk = 0) pv_rows<1, NC, TL>(v2, pstride, np, pb + r, 1, pp, o + r * ost, ost, pf, pfk, n);
}

// One O row of a TL item (pv_rows), its 32-dim groups put back in dim order.
static inline void o_natural(const float* __restrict src, int Dv, float* __restrict dst) {
    for (int g = 0; g < Dv; g += 32)
        for (int k = 0; k < 16; ++k) {
            dst[g + 8 * (k / 4) + k % 4] = src[g + k];
            dst[g + 8 * (k / 4) + 4 + k % 4] = src[g + 16 + k];
        }
}

// Scheme (per item: M query rows, one KV head, a run of blocks): rows in chunks of up to 16;
// per block and chunk, Q.K as VDPBF16PS dot products whose per-lane partial sums are reduced
// 32 scores at a time (sum_halves16) into token-major scores, a vertical online softmax
// (softmax_tm) that writes P as the bf16 pairs P.V broadcasts, then P.V. The AMX kernel keeps
// its scores token-major for the same reason (attn_amx.cpp).
// TL: T blocks (the GPU layout) read in place -- qk_tm's and pv_rows's TL forms -- instead of
// being copied into the C layout's pairs first (ws_repack); bf16_item chooses (a template
// parameter, so the C layout's code is the same as without it).

// qk_tm on NP token pairs from pair p: in the C layout at k2, or (TL) in place, token t's K at
// kt + t * ts; a pair's missing second token (odd n) reads the first again (its score slot is
// overwritten with -inf by softmax_tm).
template <int MB, int NP, int SS = MB, bool TL = false>
__attribute__((always_inline)) static inline void qk_at(const uint16_t* k2, int64_t pst2,
        const uint16_t* kt, int64_t ts, int p, int n, const uint16_t* qb, int nK, __m512i perm,
        float* s) {
    if constexpr (TL) {
        const uint16_t* tk[2 * NP];
        for (int j = 0; j < 2 * NP; ++j) {
            const int t = 2 * p + j;
            tk[j] = kt + (int64_t)(t < n ? t : t - 1) * ts;
        }
        qk_tm<MB, NP, SS, true>(nullptr, 0, qb, nK, perm, s, tk);
    } else {
        qk_tm<MB, NP, SS>(k2 + p * pst2, pst2, qb, nK, perm, s);
    }
}

template <bool TL>
static void bf16_item_t(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dk = a->Dk, Dv = a->Dv;
    const int nK = Dk / 16, nV = Dv / 16;
    const int bsp = (int)ws_round_up(bs, 2);
    const int nsl = (int)ws_round_up(bsp, 4);  // score slots a block can take
    const int nmc = (M + 15) / 16;
    const int64_t qst = 32 * 16 * (int64_t)nK, ost = Dv;  // Qb: per 16-row chunk [nK][16 rows][32]
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    size_t oq = take(2 * (size_t)nmc * qst), os = take(4 * (size_t)nsl * 16 + 64);
    size_t op = take(4 * (size_t)(nsl / 2) * 16), oo = take(4 * (size_t)M * ost);
    size_t om = take(4 * (size_t)nmc * 16 * 2 + 64), ot = take(2 * (size_t)bsp * R);
    char* base = ws_scratch(off);
    uint16_t* Qb = (uint16_t*)(base + oq);
    float* S = (float*)(base + os);
    uint32_t* Pp = (uint32_t*)(base + op);
    float* O = (float*)(base + oo);
    float* mrun = (float*)(base + om);   // [nmc][16]
    float* lrun = mrun + nmc * 16;       // [nmc][16]
    alignas(64) float alpha[16];
    uint16_t* tilebuf = (uint16_t*)(base + ot);

    // queries: per 16-row chunk, 16-dim chunk and row, the 16 dims (bf16) twice; rows past M are zero
    memset(Qb, 0, 2 * (size_t)nmc * qst);
    for (int r = 0; r < M; ++r) {
        const float* q = it->q + (int64_t)r * Dk;
        uint16_t* d = Qb + (r / 16) * qst + 32 * (r % 16);
        for (int c = 0; c < nK; ++c)
            for (int i = 0; i < 16; ++i) d[512 * c + i] = d[512 * c + 16 + i] = f2bf(q[16 * c + i]);
    }
    for (int i = 0; i < nmc * 16; ++i) { mrun[i] = -INFINITY; lrun[i] = 0.0f; }
    memset(O, 0, sizeof(float) * (size_t)M * ost);
    alignas(64) uint16_t pidx[32];
    for (int j = 0; j < 16; ++j) { pidx[j] = (uint16_t)(2 * j); pidx[16 + j] = (uint16_t)(2 * j + 1); }
    const __m512i perm = _mm512_loadu_si512((const void*)pidx);
    const int64_t pst2 = 2 * (int64_t)R;
    const int64_t ts = (int64_t)a->H * R;  // TL: elements from one token's record to the next
    const int mlast = M - 16 * (nmc - 1);
    const SmIdx ix16 = sm_idx(16), ixlast = sm_idx(mlast <= 4 ? 4 : mlast <= 8 ? 8 : 16);

    for (int bi = 0; bi < it->nblocks; ++bi) {
        const int n = it->lens[bi];
        if (n <= 0) continue;
        WsPf pf;
        const uint16_t* tile;
        if constexpr (TL) {
            tile = ws_block_ptr<uint16_t>(a, it->blocks[bi], it->head);  // token 0's record
            ws_pf_init<uint16_t>(pf, a, it, bi);
        } else {
            tile = ws_block_tile<uint16_t>(a, it, bi, n, bsp, tilebuf, pf);
        }
        const int np = (n + 1) / 2;
        // lines per Q.K pair step and per P.V pair step (two 16-dim columns), in proportion to
        // their products: nK and 2 of nK + nV per pair
        const int64_t pf_div = (int64_t)np * (nK + nV);
        const int64_t pf_k = (pf.total * nK + pf_div - 1) / pf_div, pf_v = (pf.total * 2 + pf_div - 1) / pf_div;
        const uint16_t* k2 = tile + (int64_t)a->k_off * 2;
        const uint16_t* v2 = tile + (int64_t)a->v_off * 2;
        const uint16_t* kt = tile + a->k_off;  // TL: token 0's K and V
        const uint16_t* vt = tile + a->v_off;
        for (int mc = 0; mc < nmc; ++mc) {
            const int m0 = 16 * mc, mp = M - m0 < 16 ? M - m0 : 16;
            const int Ms = mp <= 4 ? 4 : mp <= 8 ? 8 : 16;
            const uint16_t* qb = Qb + (int64_t)mc * qst;
            // the next block's lines, spread over the first chunk's Q.K and P.V pair steps
            const int64_t pfk = mc == 0 ? pf_k : 0;
            int p = 0;
            if (Ms == 16) {  // two 8-row halves of two pairs: 10 loads per 16 products, not 17
                for (; p + 2 <= np; p += 2) {
                    ws_pf_step(pf, 2 * pfk);
                    qk_at<8, 2, 16, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 16);
                    qk_at<8, 2, 16, TL>(k2, pst2, kt, ts, p, n, qb + 8 * 32, nK, perm, S + 2 * p * 16 + 8);
                }
                for (; p < np; ++p) qk_at<16, 1, 16, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 16);
            } else if (Ms == 8) {
                for (; p + 2 <= np; p += 2) {
                    ws_pf_step(pf, 2 * pfk);
                    qk_at<8, 2, 8, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 8);
                }
                for (; p < np; ++p) qk_at<8, 1, 8, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 8);
            } else {
                for (; p + 4 <= np; p += 4) {
                    ws_pf_step(pf, 4 * pfk);
                    qk_at<4, 4, 4, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 4);
                }
                for (; p < np; ++p) qk_at<4, 1, 4, TL>(k2, pst2, kt, ts, p, n, qb, nK, perm, S + 2 * p * 4);
            }
            softmax_tm(mc + 1 < nmc ? ix16 : ixlast, n, S, Pp, mrun + m0, lrun + m0, alpha);
            float* Oc = O + (int64_t)m0 * ost;
            for (int r = 0; r < mp; ++r) {
                if (alpha[r] == 1.0f) continue;
                const __m512 al = _mm512_set1_ps(alpha[r]);
                float* o = Oc + r * ost;
                for (int c = 0; c < Dv; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), al));
            }
            const int64_t pvk = mc == 0 ? pf_v : 0;
            int c = 0;
            if constexpr (TL) {
                for (; c < nV; c += 2) pv_all<2, true>(vt + 16 * c, ts, np, Pp, Ms, Oc + 16 * c, ost, mp, pf, pvk, n);
            } else {
                for (; c + 2 <= nV; c += 2) pv_all<2>(v2 + 32 * c, pst2, np, Pp, Ms, Oc + 16 * c, ost, mp, pf, pvk);
                for (; c < nV; ++c) pv_all<1>(v2 + 32 * c, pst2, np, Pp, Ms, Oc + 16 * c, ost, mp, pf, pvk);
            }
            ws_pf_step(pf, pf.total);  // whatever the steps above left
        }
    }
    for (int r = 0; r < M; ++r) {
        if constexpr (TL) o_natural(O + r * ost, Dv, it->o + (int64_t)r * Dv);
        else memcpy(it->o + (int64_t)r * Dv, O + r * ost, sizeof(float) * Dv);
        it->m[r] = mrun[r];
        it->l[r] = lrun[r];
    }
}

// T blocks are read in place when the V dims come in 32s. In place against the copy into pairs,
// bench.cpu_ab on the T layout, 9 paired calls a shape: Mixtral's GQA (8 KV heads) 1.08-1.16x,
// Qwen3's (4) 1.07-1.12x, MLA 1.02-1.07x on the Zen 4 dev VM, where the C layout's code ran
// 0.99-1.03x the build without the T form (in bench/results/: cpu_ab-ct-devbox-zen4-2026-12-04d-
// run1.log, -run2.log, MLA's T still copied there; MLA's in place:
// cpu_ab-t-mla-inplace-devbox-zen4-2026-12-04d.log, -run2.log). On the H200
// host a first version, which tested the layout at run time inside the loops, read T 0.94-1.08x
// (Mixtral's) and 1.04-1.08x (Qwen3's) as fast as the copy, and its C layout 0.93-0.98x
// (2026-12-04d-h200 call 3); this form is not measured there.
static void bf16_item(const WsArgs* a, const WsItem* it) {
    if (a->layout != 0 && a->Dv % 32 == 0) bf16_item_t<true>(a, it);
    else bf16_item_t<false>(a, it);
}

}  // namespace

#ifndef WS_BF16_ITEM_FN
int ws_bf16_eligible(const WsArgs* a) {
    return a->dtype == 1 && a->Dk % 16 == 0 && a->Dv % 16 == 0 && a->k_off % 16 == 0 &&
           a->v_off % 16 == 0;
}
#define WS_BF16_ITEM_FN ws_item_avx512bf16
#endif

void WS_BF16_ITEM_FN(const WsArgs* a, const WsItem* it) {
    if (ws_bf16_eligible(a)) bf16_item(a, it);
    else ws_item_dispatch(a, it);
}
