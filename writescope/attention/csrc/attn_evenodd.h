// bf16 decode-attention item kernel for the AVX2 unit (attn_avx2.cpp), the "even/odd" form.
//
// A C-layout token pair keeps the two tokens' values of one dim in one 32-bit lane
// (attn_common.h), so one 2W-value load widens to fp32 with one shift (the even token's values,
// the low halves) and one AND (the odd token's, the high halves): W dims of each token, no
// lane-pair shuffles. In the GPU layout the two tokens' rows are read in place, W values of each
// widened. Query and output rows are plain [M][D] fp32. Against the generic kernel
// (attn_impl.h), which loads W/2 dims of both tokens and multiplies by q duplicated per lane pair:
//  - Q.K: each q load feeds two FMAs (even and odd token); 4 query rows x 2 tokens in 8
//    accumulators, reduced 8 at a time with horizontal adds (V::reduce8);
//  - P.V: 4 query rows x 2W dims of O stay in registers across the block's pairs; per pair two
//    V loads and 8 broadcasts of p feed 16 FMAs (the generic form: 9 loads per 8 FMAs).
// On the 2-core AVX2 dev VM (AMD EPYC, Zen 3), `bench.cpu_ab --defines WS_EVENODD=0`, two
// threads: MLA 16/1/576 1.60-1.74x, GQA 32/4/128 1.02-1.13x, in both layouts (2026-12-03).
// Needs bf16 KV and Dk, Dv multiples of V::W (ws_evenodd_eligible); -DWS_EVENODD=0 turns it off.
// `V` adds pin, bcast1, load_eo and reduce8 to the traits attn_impl.h uses.

#ifndef WS_EVENODD
#define WS_EVENODD 1
#endif

static inline bool ws_evenodd_eligible(const WsArgs* a) {
    return WS_EVENODD && a->dtype == 1 && a->Dk % V::W == 0 && a->Dv % V::W == 0;
}

// Token pair p of a block: in the C layout one interleaved record (`e` points at it, `o` unused);
// in the GPU layout two token rows read in place (`e`, `o`; `o` a zero row past the block's last
// token, so that nothing from an unused slot reaches the sums).
template <bool GL>
static inline void ws_pair_eo(const uint16_t* e, const uint16_t* o, int d, typename V::vec& ve,
                              typename V::vec& vo) {
    if constexpr (GL) { ve = V::load(e + d); vo = V::load(o + d); }
    else V::load_eo(e + 2 * d, ve, vo);
}

// s[r*sst + t] = q_r . k_t for the pair's two tokens t, rows r < MB.
template <int MB, bool GL>
static inline void ws_qk_eo(const uint16_t* __restrict ke_p, const uint16_t* __restrict ko_p,
                            const float* __restrict q, int Dk, float* __restrict s, int64_t sst) {
    typename V::vec e[MB], o[MB];
    for (int r = 0; r < MB; ++r) e[r] = o[r] = V::zero();
    for (int d = 0; d < Dk; d += V::W) {
        typename V::vec ke, ko;
        ws_pair_eo<GL>(ke_p, ko_p, d, ke, ko);
        for (int r = 0; r < MB; ++r) {
            typename V::vec qv = V::loadf(q + (int64_t)r * Dk + d);
            V::pin(qv);  // one load for both FMAs: the compiler would fold it into each
            e[r] = V::fma(ke, qv, e[r]);
            o[r] = V::fma(ko, qv, o[r]);
        }
    }
    if constexpr (MB == 4) {
        typename V::vec v[8] = {e[0], o[0], e[1], o[1], e[2], o[2], e[3], o[3]};
        alignas(64) float out[8];
        V::reduce8(v, out);
        for (int r = 0; r < 4; ++r) { s[r * sst] = out[2 * r]; s[r * sst + 1] = out[2 * r + 1]; }
    } else {
        for (int r = 0; r < MB; ++r) { s[r * sst] = V::hsum(e[r]); s[r * sst + 1] = V::hsum(o[r]); }
    }
}

// Where a block's token pairs are: the C tile (`base` at the pair records, `pstride` elements
// from one pair to the next) or the GPU layout's rows (`base` at token 0's record of the head,
// `pstride` = 2 rows, `ts` = 1 row; `zero` a zeroed row for the odd partner of an odd last token).
struct WsPairs {
    const uint16_t* base;
    int64_t pstride, ts;
    int n;
    const uint16_t* zero;
};

template <bool GL>
static inline const uint16_t* ws_pair_e(const WsPairs& b, int p, int off) {
    return b.base + (int64_t)p * b.pstride + (GL ? off : 2 * off);
}
template <bool GL>
static inline const uint16_t* ws_pair_o(const WsPairs& b, int p, int off) {
    if constexpr (GL) return 2 * p + 1 < b.n ? b.base + (int64_t)p * b.pstride + b.ts + off : b.zero;
    else return nullptr;
}

// O[r][c .. c + CH*W) += sum_p p[r][2p] v_{2p} + p[r][2p+1] v_{2p+1} over the block's pairs
// (`off`: the V part's offset in the record plus c).
template <int MB, int CH, bool GL>
static inline void ws_pv_eo(const WsPairs& b, int off, int np, const float* __restrict P,
                            int64_t pst, float* __restrict o, int Dv) {
    typename V::vec acc[MB][CH];
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < CH; ++j) acc[r][j] = V::loadf(o + (int64_t)r * Dv + j * V::W);
    for (int p = 0; p < np; ++p) {
        const uint16_t* pe = ws_pair_e<GL>(b, p, off);
        const uint16_t* po = ws_pair_o<GL>(b, p, off);
        typename V::vec ve[CH], vo[CH];
        for (int j = 0; j < CH; ++j) ws_pair_eo<GL>(pe, po, j * V::W, ve[j], vo[j]);
        for (int r = 0; r < MB; ++r) {
            typename V::vec we = V::bcast1(P + r * pst + 2 * p), wo = V::bcast1(P + r * pst + 2 * p + 1);
            for (int j = 0; j < CH; ++j) acc[r][j] = V::fma(vo[j], wo, V::fma(ve[j], we, acc[r][j]));
        }
    }
    for (int r = 0; r < MB; ++r)
        for (int j = 0; j < CH; ++j) V::storef(o + (int64_t)r * Dv + j * V::W, acc[r][j]);
}

template <int MB, bool GL>
static inline void ws_pv_eo_cols(const WsPairs& b, int v_off, int np, const float* P, int64_t pst,
                                 float* o, int Dv) {
    int c = 0;
    for (; c + 2 * V::W <= Dv; c += 2 * V::W) ws_pv_eo<MB, 2, GL>(b, v_off + c, np, P, pst, o + c, Dv);
    for (; c < Dv; c += V::W) ws_pv_eo<MB, 1, GL>(b, v_off + c, np, P, pst, o + c, Dv);
}

// One block's scores, softmax update and P.V for the item's M rows.
template <bool GL>
static inline void ws_block_eo(const WsArgs* a, const WsPairs& b, WsPf& pf, const float* Q, int M,
                               float* S, int64_t sst, int spad, float* mrun, float* lrun,
                               float* alpha, float* O) {
    const int n = b.n, np = (n + 1) / 2, Dk = a->Dk, Dv = a->Dv;
    const int64_t pf_k = (pf.total + np - 1) / np;
    for (int p = 0; p < np; ++p) {
        ws_pf_step(pf, pf_k);
        const uint16_t* ke = ws_pair_e<GL>(b, p, a->k_off);
        const uint16_t* ko = ws_pair_o<GL>(b, p, a->k_off);
        float* s = S + 2 * p;
        int r = 0;
        for (; r + 4 <= M; r += 4) ws_qk_eo<4, GL>(ke, ko, Q + (int64_t)r * Dk, Dk, s + r * sst, sst);
        for (; r + 2 <= M; r += 2) ws_qk_eo<2, GL>(ke, ko, Q + (int64_t)r * Dk, Dk, s + r * sst, sst);
        for (; r < M; ++r) ws_qk_eo<1, GL>(ke, ko, Q + (int64_t)r * Dk, Dk, s + r * sst, sst);
    }
    ws_softmax_block(M, n, spad, S, sst, mrun, lrun, alpha);
    for (int r = 0; r < M; ++r) {
        if (alpha[r] == 1.0f) continue;
        typename V::vec al = V::set1(alpha[r]);
        float* o = O + (int64_t)r * Dv;
        for (int c = 0; c < Dv; c += V::W) V::storef(o + c, V::mul(V::loadf(o + c), al));
    }
    // P.V (P is in S; the odd partner of an odd last token has p = 0 and a zeroed record)
    int r = 0;
    for (; r + 4 <= M; r += 4) ws_pv_eo_cols<4, GL>(b, a->v_off, np, S + r * sst, sst, O + (int64_t)r * Dv, Dv);
    for (; r + 2 <= M; r += 2) ws_pv_eo_cols<2, GL>(b, a->v_off, np, S + r * sst, sst, O + (int64_t)r * Dv, Dv);
    for (; r < M; ++r) ws_pv_eo_cols<1, GL>(b, a->v_off, np, S + r * sst, sst, O + (int64_t)r * Dv, Dv);
}

// The item in the even/odd form; the same contract as ws_item_generic (attn_impl.h). C-layout
// blocks are read in place when full (a partial one is copied with its unused slots zeroed),
// GPU-layout blocks always in place, row by row.
static void ws_item_evenodd(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dv = a->Dv;
    const bool gl = a->layout != 0;
    const int bsp = (int)ws_round_up(bs, 2);
    const int spad = (int)ws_round_up(bsp, V::W);
    const int64_t sst = spad;
    // scratch: S [M][spad] | mrun,lrun,alpha [3M] | tile [bsp*R] (the GPU layout: a zero row)
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    size_t os = take(sizeof(float) * M * sst), om = take(sizeof(float) * 3 * M);
    size_t ot = take(sizeof(uint16_t) * (size_t)bsp * R);
    char* base = ws_scratch(off);
    float* S = (float*)(base + os);
    float* mrun = (float*)(base + om);
    float* lrun = mrun + M;
    float* alpha = lrun + M;
    uint16_t* tilebuf = (uint16_t*)(base + ot);
    if (gl) memset(tilebuf, 0, sizeof(uint16_t) * R);
    float* O = it->o;  // accumulated in place
    for (int r = 0; r < M; ++r) { mrun[r] = -INFINITY; lrun[r] = 0.0f; }
    memset(O, 0, sizeof(float) * M * Dv);

    for (int bi = 0; bi < it->nblocks; ++bi) {
        const int n = it->lens[bi];
        if (n <= 0) continue;
        WsPf pf;
        WsPairs b;
        b.n = n;
        b.zero = tilebuf;
        if (gl) {
            b.base = ws_block_ptr<uint16_t>(a, it->blocks[bi], it->head);
            b.ts = (int64_t)a->H * R;
            b.pstride = 2 * b.ts;
            ws_pf_init<uint16_t>(pf, a, it, bi);
            ws_block_eo<true>(a, b, pf, it->q, M, S, sst, spad, mrun, lrun, alpha, O);
        } else {
            b.base = ws_block_tile<uint16_t>(a, it, bi, n, bsp, tilebuf, pf);
            b.pstride = 2 * R;
            b.ts = 0;
            ws_block_eo<false>(a, b, pf, it->q, M, S, sst, spad, mrun, lrun, alpha, O);
        }
    }
    for (int r = 0; r < M; ++r) { it->m[r] = mrun[r]; it->l[r] = lrun[r]; }
}
