// Generic decode-attention item kernel, written once over a SIMD traits struct `V`
// (V::W fp32 lanes). Included inside an anonymous namespace by attn_avx2.cpp and
// attn_avx512.cpp (and by attn_amx.cpp for the shared helpers), after `V` is defined.
//
// Data flow for one item (M query vectors, one KV head, a run of blocks):
//   per block: scores of every (query, token) -> block max -> online-softmax update (base 2)
//   -> P.V accumulated into an "interleaved" accumulator O2[M][2*Dv] whose even lanes hold the
//   contributions of even tokens and odd lanes those of odd tokens; folded once at the end.
// The C layout keeps token pairs interleaved ([bs/2][R][2]), so one vector load brings W/2
// dims of two tokens; K.q uses q duplicated per lane pair and a pairwise horizontal sum, P.V
// broadcasts (p[t], p[t+1]) -- no transposes, every K/V row is converted once and used by all
// M query vectors (the whole GQA group, or all 16 MLA heads).
// Ideas from llama.cpp's ggml_compute_forward_flash_attn_ext (online softmax over the KV
// stream, split over threads) and FlashInfer/vLLM CPU paged decode (work split over
// sequence x kv-head x chunk, merged by log-sum-exp); the code is our own.

// (the including unit includes <stdlib.h>, <string.h>, <math.h> before its namespace)

static inline int64_t ws_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct WsScratch { char* p; size_t cap; };
static thread_local WsScratch g_ws_scratch = {nullptr, 0};

static char* ws_scratch(size_t n) {
    if (n > g_ws_scratch.cap) {
        free(g_ws_scratch.p);
        size_t cap = (size_t)ws_round_up((int64_t)n + (n >> 2), 4096);
        g_ws_scratch.p = (char*)aligned_alloc(64, cap);
        g_ws_scratch.cap = cap;
    }
    return g_ws_scratch.p;
}

// Pointer to head `h` of block `b` in the C layout, or to token 0's record in the GPU layout.
template <class T>
static inline const T* ws_block_ptr(const WsArgs* a, int b, int h) {
    const T* base = (const T*)a->kv + (int64_t)b * a->block_stride;
    return a->layout == 0 ? base + (int64_t)h * a->bs * a->R : base + (int64_t)h * a->R;
}

// Software prefetch of the *next* block of an item into L2, spread over the current block's
// work (a few lines per step), so the strided tile/row loads of the next block hit cache
// instead of each waiting on DRAM.
struct WsPf {
    const char* base;
    int64_t row_stride;  // 0: one contiguous run
    int64_t lines_per_row, total, next;
};

template <class T>
static inline void ws_pf_init(WsPf& pf, const WsArgs* a, const WsItem* it, int bi) {
    pf.total = pf.next = 0;
    if (bi + 1 >= it->nblocks) return;
    const int n = it->lens[bi + 1];
    if (n <= 0) return;
    pf.base = (const char*)ws_block_ptr<T>(a, it->blocks[bi + 1], it->head);
    if (a->layout == 0) {
        pf.row_stride = 0;
        pf.lines_per_row = pf.total = ((int64_t)((n + 1) / 2) * 2 * a->R * (int64_t)sizeof(T) + 63) / 64;
    } else {
        pf.row_stride = (int64_t)a->H * a->R * (int64_t)sizeof(T);
        pf.lines_per_row = ((int64_t)a->R * (int64_t)sizeof(T) + 63) / 64;
        pf.total = (int64_t)n * pf.lines_per_row;
    }
}

// The prefetch's cache level: L2 unless the including unit says otherwise (attn_bf16.cpp: L1).
#ifndef WS_PF_HINT
#define WS_PF_HINT _MM_HINT_T1
#endif
// WS_SW_PF=0 builds the kernels without these software prefetches (an experiment's knob:
// `bench.cpu_ab --defines WS_SW_PF=0`, e.g. with --cold-bytes 0 for the kernels' compute alone).
#ifndef WS_SW_PF
#define WS_SW_PF 1
#endif
// The next k lines (fewer at the block's end). A pointer walk, with no division per line in the
// GPU layout: the loop is the kernels' most frequent (a line of the next block per 64 bytes of
// this one's), and its old form took 8 instructions a line in the C layout and a 64-bit
// division a line in the GPU layout.
static inline void ws_pf_step(WsPf& pf, int64_t k) {
    const int64_t end = pf.next + k < pf.total ? pf.next + k : pf.total;
    if (end <= pf.next) return;
    if (!WS_SW_PF) {
        // no prefetch; the cursor still advances (the AMX kernel's ipf_step moves on by it)
    } else if (pf.row_stride == 0) {
        for (const char *p = pf.base + pf.next * 64, *e = pf.base + end * 64; p < e; p += 64)
            _mm_prefetch(p, WS_PF_HINT);
    } else {
        int64_t r = pf.next / pf.lines_per_row, j = pf.next - r * pf.lines_per_row;
        const char* row = pf.base + r * pf.row_stride;
        for (int64_t i = pf.next; i < end; ++i) {
            _mm_prefetch(row + j * 64, WS_PF_HINT);
            if (++j == pf.lines_per_row) { j = 0; row += pf.row_stride; }
        }
    }
    pf.next = end;
}

// Copy the first n tokens of a block into `dst` in the C tile format ([pad/2][R][2]) and zero
// tokens n..pad-1 (pad even), so that garbage in unused slots can never reach the sums.
template <class T>
static void ws_repack(const WsArgs* a, const T* src, int n, int pad, T* dst) {
    const int R = a->R;
    const int np = (n + 1) / 2;
    if (a->layout == 0) {
        memcpy(dst, src, sizeof(T) * (size_t)np * R * 2);
        if (n & 1) {
            T* row = dst + (int64_t)(np - 1) * R * 2;
            for (int d = 0; d < R; ++d) row[2 * d + 1] = 0;
        }
    } else {
        const int64_t ts = (int64_t)a->H * R;
        for (int p = 0; p < np; ++p) {
            const T* __restrict r0 = src + (int64_t)(2 * p) * ts;
            T* __restrict o = dst + (int64_t)p * R * 2;
            if (2 * p + 1 < n) {
                const T* __restrict r1 = r0 + ts;
                for (int d = 0; d < R; ++d) { o[2 * d] = r0[d]; o[2 * d + 1] = r1[d]; }
            } else {
                for (int d = 0; d < R; ++d) { o[2 * d] = r0[d]; o[2 * d + 1] = 0; }
            }
        }
    }
    if (2 * np < pad) memset(dst + (int64_t)np * R * 2, 0, sizeof(T) * (size_t)(pad - 2 * np) * R);
}

// The block's records in the C tile format -- in place for a full C-layout block, else repacked
// (GPU layout, or a partial block) into `tilebuf` with `pad` token slots -- and the prefetch of
// the item's next block set up in `pf`.
template <class T>
static inline const T* ws_block_tile(const WsArgs* a, const WsItem* it, int bi, int n, int pad,
                                     T* tilebuf, WsPf& pf) {
    const T* tile = ws_block_ptr<T>(a, it->blocks[bi], it->head);
    if (a->layout != 0 || n != a->bs) {
        ws_repack<T>(a, tile, n, pad, tilebuf);
        tile = tilebuf;
    }
    ws_pf_init<T>(pf, a, it, bi);
    return tile;
}

// acc[r] = sum_c K2[c] * Q2[r][c] over the record's K part of one token pair; writes the two
// scores of every row. K2: the pair's interleaved K values; Q2: q duplicated per lane pair.
template <int MB, class T>
static inline void ws_qk_rows(const T* __restrict k2, const float* __restrict q2, int64_t qstride,
                              int n2, float* __restrict s, int64_t sstride) {
    typename V::vec acc[MB];
    for (int r = 0; r < MB; ++r) acc[r] = V::zero();
    for (int c = 0; c < n2; c += V::W) {
        typename V::vec k = V::load(k2 + c);
        for (int r = 0; r < MB; ++r) acc[r] = V::fma(k, V::loadf(q2 + r * qstride + c), acc[r]);
    }
    for (int r = 0; r < MB; ++r) V::hpair(acc[r], s + r * sstride);
}

// O2[r][c..c+W) += sum_p V2_p[c..c+W) * (p[r][2p], p[r][2p+1]) over the block's token pairs.
template <int MB, class T>
static inline void ws_pv_rows(const T* __restrict v2, int64_t pstride, int np,
                              const float* __restrict P, int64_t pst, float* __restrict o2,
                              int64_t ostride) {
    typename V::vec acc[MB];
    for (int r = 0; r < MB; ++r) acc[r] = V::loadf(o2 + r * ostride);
    for (int p = 0; p < np; ++p) {
        typename V::vec v = V::load(v2 + (int64_t)p * pstride);
        for (int r = 0; r < MB; ++r) acc[r] = V::fma(v, V::bcast2(P + r * pst + 2 * p), acc[r]);
    }
    for (int r = 0; r < MB; ++r) V::storef(o2 + r * ostride, acc[r]);
}

// Online-softmax update of one block's scores S[M][*] (n valid tokens, row length npad, a
// multiple of W, entries n..npad-1 ignored). Writes P (fp32, 0 past n) in place of S, and
// returns per-row alpha = 2^(m_old - m_new).
static void ws_softmax_block(int M, int n, int npad, float* S, int64_t sst, float* mrun,
                             float* lrun, float* alpha) {
    const float ninf = -INFINITY;
    for (int r = 0; r < M; ++r) {
        float* s = S + r * sst;
        for (int t = n; t < npad; ++t) s[t] = ninf;
        typename V::vec mx = V::set1(ninf);
        for (int t = 0; t < npad; t += V::W) mx = V::max(mx, V::loadf(s + t));
        float bmax = V::hmax(mx);
        float mnew = bmax > mrun[r] ? bmax : mrun[r];
        float al = mrun[r] == ninf ? 0.0f : exp2f(mrun[r] - mnew);
        typename V::vec mv = V::set1(mnew), sum = V::zero();
        for (int t = 0; t < npad; t += V::W) {
            typename V::vec p = V::exp2(V::sub(V::loadf(s + t), mv));
            V::storef(s + t, p);
            sum = V::add(sum, p);
        }
        lrun[r] = lrun[r] * al + V::hsum(sum);
        mrun[r] = mnew;
        alpha[r] = al;
    }
}

template <class T>
static void ws_item_generic(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dk = a->Dk, Dv = a->Dv;
    const int bsp = (int)ws_round_up(bs, 2);
    const int spad = (int)ws_round_up(bsp, V::W);
    const int64_t q2s = 2 * Dk, o2s = 2 * Dv, sst = spad;
    // scratch: Q2 [M][2Dk] | O2 [M][2Dv] | S [M][spad] | mrun,lrun,alpha [3M] | tile [bsp*R]
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    size_t oq = take(sizeof(float) * M * q2s), oo = take(sizeof(float) * M * o2s);
    size_t os = take(sizeof(float) * M * sst), om = take(sizeof(float) * 3 * M);
    size_t ot = take(sizeof(T) * (size_t)bsp * R);
    char* base = ws_scratch(off);
    float* Q2 = (float*)(base + oq);
    float* O2 = (float*)(base + oo);
    float* S = (float*)(base + os);
    float* mrun = (float*)(base + om);
    float* lrun = mrun + M;
    float* alpha = lrun + M;
    T* tilebuf = (T*)(base + ot);

    for (int r = 0; r < M; ++r) {
        const float* q = it->q + (int64_t)r * Dk;
        for (int d = 0; d < Dk; ++d) Q2[r * q2s + 2 * d] = Q2[r * q2s + 2 * d + 1] = q[d];
        mrun[r] = -INFINITY;
        lrun[r] = 0.0f;
    }
    memset(O2, 0, sizeof(float) * M * o2s);

    for (int bi = 0; bi < it->nblocks; ++bi) {
        const int n = it->lens[bi];
        if (n <= 0) continue;
        WsPf pf;
        const T* tile = ws_block_tile<T>(a, it, bi, n, bsp, tilebuf, pf);
        const int np = (n + 1) / 2;
        const int64_t pf_k = (pf.total + np - 1) / np;
        // scores
        for (int p = 0; p < np; ++p) {
            ws_pf_step(pf, pf_k);
            const T* k2 = tile + ((int64_t)p * R + a->k_off) * 2;
            int r = 0;
            for (; r + 8 <= M; r += 8) ws_qk_rows<8, T>(k2, Q2 + r * q2s, q2s, 2 * Dk, S + r * sst + 2 * p, sst);
            for (; r + 4 <= M; r += 4) ws_qk_rows<4, T>(k2, Q2 + r * q2s, q2s, 2 * Dk, S + r * sst + 2 * p, sst);
            for (; r < M; ++r) ws_qk_rows<1, T>(k2, Q2 + r * q2s, q2s, 2 * Dk, S + r * sst + 2 * p, sst);
        }
        ws_softmax_block(M, n, spad, S, sst, mrun, lrun, alpha);
        for (int r = 0; r < M; ++r) {
            if (alpha[r] == 1.0f) continue;
            typename V::vec al = V::set1(alpha[r]);
            float* o = O2 + r * o2s;
            for (int c = 0; c < 2 * Dv; c += V::W) V::storef(o + c, V::mul(V::loadf(o + c), al));
        }
        // P.V (P is in S; token n, if n is odd, has p = 0 and a zeroed record)
        const T* v2 = tile + (int64_t)a->v_off * 2;
        for (int c = 0; c < 2 * Dv; c += V::W) {
            int r = 0;
            for (; r + 8 <= M; r += 8) ws_pv_rows<8, T>(v2 + c, 2 * R, np, S + r * sst, sst, O2 + r * o2s + c, o2s);
            for (; r + 4 <= M; r += 4) ws_pv_rows<4, T>(v2 + c, 2 * R, np, S + r * sst, sst, O2 + r * o2s + c, o2s);
            for (; r < M; ++r) ws_pv_rows<1, T>(v2 + c, 2 * R, np, S + r * sst, sst, O2 + r * o2s + c, o2s);
        }
    }
    for (int r = 0; r < M; ++r) {
        const float* o2 = O2 + r * o2s;
        float* o = it->o + (int64_t)r * Dv;
        for (int d = 0; d < Dv; ++d) o[d] = o2[2 * d] + o2[2 * d + 1];
        it->m[r] = mrun[r];
        it->l[r] = lrun[r];
    }
}

static void ws_item_dispatch(const WsArgs* a, const WsItem* it) {
    if (a->dtype == 1) ws_item_generic<uint16_t>(a, it);
    else ws_item_generic<float>(a, it);
}
