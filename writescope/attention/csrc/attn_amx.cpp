// AMX-BF16 build: both matrix products on the tile unit, softmax in AVX-512.
//
// Scheme (per item: M query rows, one KV head, a run of blocks):
//  * Scale: the items' q carry scale * log2(e) (attn_ops.cpp); it is divided out before q is
//    rounded to bf16 and applied to the fp32 scores in the softmax, so bf16 queries stay exact.
//  * Passes (super-blocks). Consecutive blocks are gathered into passes of up to kSB = 256 token slots
//    (a block larger than that is a pass of its own); the online softmax (running max, rescale
//    of the fp32 O accumulator) runs once per pass, not per block. Outer loop: passes; inner:
//    chunks of 16 query rows, so every K/V byte of a pass is read from DRAM once for all chunks
//    (chunked prefill has M = heads x queries > 16) and reused from L2.
//  * Scores come out token-major, S[slot][16 rows] fp32, one zmm per token: the softmax over a
//    pass is vertical (max / exp2 / sum across zmm, no horizontal reductions), and P is turned
//    into the A operand of P.V (P[row][32 slots] bf16) with one 16x16 dword transpose per 32
//    tokens (pairs of tokens are first interleaved per row with VCVTNE2PS2BF16 + VPERMW).
//  * Q.K, GPU layout ([bs][H][R], token-major records): 16 token records are the A operand in
//    place (16 rows x 32 dims, row stride H*R*2 bytes); B holds q in VNNI form,
//    B[k][2n+j] = q_n[32c + 2k + j], 16 rows per tile; C = 16 tokens x 16 rows stored straight
//    into S. No repack of K; a Dk % 32 == 16 tail goes through a 1 KB zero-padded copy.
//    P.V reads V (MLA: the first 512 dims of the same rows) in place too, in the parity form
//    (Dv % 32 == 0; -DWS_PV_PAR=0 restores the copy below): B = 16 token rows x 32 values, A =
//    the tile's P with a zero in every other word, once for the even values and once for the
//    odd ones, so twice the products and no copy; O keeps each 32 values' even ones before its
//    odd ones until the item's end. A tile past its block's end is copied, zero-padded (garbage
//    there would reach O through 0 * NaN). On the H200 (twentieth session, bench.cpu_ab
//    --layouts C,T, four runs, per-call ratios): 1.02-1.15x the copy below for MLA, 1.06-1.19x
//    for GQA; still 0.84-0.94x the C layout (MLA: token-major copies of K, P.V on pair rows
//    in place), so the C layout keeps its pairs. Without it, V is pair-interleaved into a
//    per-pass scratch right after the Q.K of those tokens (lines still in L1/L2), zero for
//    slots past a block's end. An L1 prefetch of each next Q.K step's A rows (as the C layout's
//    token-major copies have) read 0.95-1.03x either way and was removed.
//  * Q.K, C layout ([bs/2][R][2], token pairs interleaved), chunks of at most 8 rows (GQA
//    decode; all chunks with -DWS_QK_TM=0): the pair rows are the A operand in
//    place (16 pairs x 16 dims x 2 tokens) and B holds q_h in the slot of one token parity and
//    0 in the other, C[pair][(h, parity)], 8 rows per tile. Half the products are on zeros; with
//    at most 8 rows the token-major form below would waste as many (8 of a tile's 16 columns)
//    and add the copies. The two B tiles are loaded
//    once per 16-dim step and used for two 32-token groups (four C tiles, four independent
//    accumulation chains). Scores are unscrambled with two VPERMT2PS per token pair. A group
//    that runs past a block's valid tokens is copied (zero-padded) to scratch first: with the
//    parity trick a NaN/garbage partner token would reach the valid score through 0 * NaN.
//  * Q.K, C layout, chunks of more than 8 rows (MLA's 16 heads; -DWS_QK_TM=0 turns it off): at
//    each 32-dim step, the step's 128 bytes of each pair row of two groups are split into the
//    two tokens' rows (two VPERMT2W per row) in a 4 KB double-buffered copy, four
//    16-token A tiles that stay in L1; B is q in the GPU layout's form (one 1 KB tile per step,
//    16 heads). Against the parity form this halves the tile products and the B bytes (18 vs 72
//    KB of q per 16-row chunk, which stay in L1 instead of streaming from L2) and drops the
//    scores' unscrambling, for 2 permutes and 2 stores per 128 bytes of K on the vector ports.
//    The next step's lines (or the next two groups' first) are prefetched from L2 into L1
//    (PREFETCHT0, 4 KB) under this step's products (-DWS_QK_PF=0 turns it off): MLA 1.006-1.037x
//    in 9 of 9 bench.cpu_ab ratios on the H200 (nineteenth session). The same prefetch in the
//    parity form (GQA) read 0.98-1.02x and was dropped; byte shuffles (VPERMT2B) in place of the
//    word shuffles read 0.96-1.04x (median 1.00): the vector ports are not what this waits for.
//    Also measured and dropped (twentieth session, 0.97-1.01x): each step's copy made one step
//    ahead of its tile loads (its stores draining under the step before), and both L1
//    prefetches two steps / groups ahead. The one loop over (pair, step) those needed read MLA
//    0.95-0.98x this nested loop (it divides by the step count at every step), so it was reverted.
//  * P.V: B = V token-pair rows (C layout: the pool in place; GPU layout: the scratch),
//    A = P, four 16-dim O column tiles at a time (four independent chains). When no row's
//    max moved in a pass the O tiles are loaded, accumulated and stored; otherwise they start
//    from zero and O = alpha * O + tile is one AVX-512 FMA pass (no separate rescale pass).
//    C layout: the next group's V lines are prefetched from L2 into L1 (PREFETCHT0, 4 KB) while
//    this group's products run, so its tile loads hit L1 (-DWS_PV_PF=0 turns it off).
//  * Software prefetch into L2 (ws_pf_*): a cursor over the item's blocks from its second one,
//    a few lines per tile step; during a pass's Q.K it runs one block ahead of the blocks being
//    read, during P.V it covers the next pass (an item of one pass is prefetched too).
//    WS_PF_SPREAD (default 1): the next pass's lines spread over the whole of this pass, Q.K
//    and P.V (no one-block limit during Q.K; -DWS_PF_SPREAD=0 restores the limit). On the
//    2-core AMX dev VM (fifty-third session), where a core's DRAM waits add to its tile work,
//    bench.cpu_ab at distance 1 read 1.07-1.08x for MLA and 1.02-1.03x for GQA. On 16-core
//    hosts: the fifty-fifth session's H200 host 0.98-1.06x (MLA 1 x 256K +6%, the rest level);
//    the seventy-seventh's H100 host (bench/results/2026-12-07e-h100 calls 2 and 3) at the
//    default distance 2, 1.01-1.06x in 17 of 18 ratios over three runs (both families, every
//    size; 0.996x in the other), mixed at distance 1 (0.94-1.09x). Never more than 2% slower.
// Intel's AMX programming reference / SDM (TILECFG, TDPBF16PS operand format) and oneDNN's
// brgemm kernels (VNNI B operands, several C tiles sharing A/B loads) were read for the tile
// configuration and blocking; the kernel is our own. Building with -DWS_AMX_EMULATE (tests only)
// replaces the tile instructions by the portable emulation in attn_amx_emu.h.
#ifdef WS_AMX_EMULATE
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#endif
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_tiles.h"

// -DWS_PHASES (bench.cpu_phases only): time-stamp counter cycles spent in each phase of
// amx_item, summed over calls and threads (a relaxed atomic add per phase per pass).
#ifdef WS_PHASES
#include <x86intrin.h>
extern "C" {
uint64_t ws_phase_cycles[8] = {0};
uint64_t ws_phase_tsc(void) { return __rdtsc(); }
}
#define PH(i) do { uint64_t _t = __rdtsc(); __atomic_fetch_add(&ws_phase_cycles[i], _t - ph_last, __ATOMIC_RELAXED); ph_last = _t; } while (0)
#else
#define PH(i) do {} while (0)
#endif
namespace {

#include "attn_v512.h"
#include "attn_impl.h"

struct TileCfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

#ifndef WS_KSB
#define WS_KSB 256
#endif
constexpr int kSB = WS_KSB;  // token slots per online-softmax pass (-DWS_KSB: bench.cpu_phases)
#ifndef WS_QK_TM
#define WS_QK_TM 1
#endif
#ifndef WS_PV_PF  // P.V: the next group's V lines into L1 during this group's products
#define WS_PV_PF 1
#endif
#ifndef WS_QK_PF  // token-major Q.K: the next tile step's K lines into L1 during this step's products
#define WS_QK_PF 1
#endif
#ifndef WS_PV_PAR  // GPU layout: P.V on the token-major V rows in place (parity form), no V copy
#define WS_PV_PAR 1
#endif

// Eight tiles of 16 rows x 64 bytes (palette 1).
static inline void config_tiles() {
    TileCfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    T_FENCE();
    T_CFG(&cfg);
}

// One stage of a 16x16 transpose of 32-bit elements: swap the off-diagonal b x b blocks.
template <int B>
static inline void tr_stage(__m512i* r) {
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __mmask16 hi = _mm512_test_epi32_mask(iota, _mm512_set1_epi32(B));
    const __m512i ilo = _mm512_mask_add_epi32(iota, hi, iota, _mm512_set1_epi32(16 - B));
    const __m512i ihi = _mm512_mask_add_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(B)), hi, iota,
                                              _mm512_set1_epi32(16));
    for (int i = 0; i < 16; ++i) {
        if (i & B) continue;
        const __m512i x = r[i], y = r[i + B];
        r[i] = _mm512_permutex2var_epi32(x, ilo, y);
        r[i + B] = _mm512_permutex2var_epi32(x, ihi, y);
    }
}

static inline void transpose16(__m512i* r) {
    tr_stage<8>(r);
    tr_stage<4>(r);
    tr_stage<2>(r);
    tr_stage<1>(r);
}

// word 2i+j of the result = word i of a (j = 0) or of b (j = 1), i in [0, 16) (+16 for `hi`)
static inline __m512i ilv16_idx(int hi) {
    alignas(64) uint16_t idx[32];
    for (int i = 0; i < 16; ++i) {
        idx[2 * i] = (uint16_t)(i + 16 * hi);
        idx[2 * i + 1] = (uint16_t)(32 + i + 16 * hi);
    }
    return _mm512_load_si512((const void*)idx);
}

// Software prefetch into L2: a cursor over the item's blocks (in order, from its second block),
// k lines per tile step, never past block `lim`. During a pass's first Q.K sweep the limit is one
// block ahead of the blocks being read; from its P.V on, the end of the next pass.
struct ItemPf {
    const WsArgs* a;
    const WsItem* it;
    WsPf cur;  // the block the cursor is in (b - 1)
    int b, lim;
    int64_t k;  // 0 when the distance is 0: no software prefetch at all
};

#ifndef WS_PF_SPREAD
#define WS_PF_SPREAD 1
#endif
static inline void ipf_step(ItemPf& p) {
    int64_t k = p.k;
    while (k > 0) {
        if (p.cur.next >= p.cur.total) {
            if (p.b >= p.lim) return;
            ws_pf_init<uint16_t>(p.cur, p.a, p.it, p.b - 1);  // sets up block p.b
            ++p.b;
            continue;
        }
        const int64_t n = k < p.cur.total - p.cur.next ? k : p.cur.total - p.cur.next;
        ws_pf_step(p.cur, n);
        k -= n;
    }
}

// Q.K of up to four 32-token groups against one query tile: tiles 0..nb-1 = sum over `nd`
// 32-value chunks of group i (A operand, rows `rstride` bytes apart) . Bq chunk (B, tile 6);
// A operands alternate between tiles 4 and 5 so consecutive loads and products overlap.
static inline void qk_groups(const uint16_t* s0, const uint16_t* s1, const uint16_t* s2,
                             const uint16_t* s3, int nb, int nd, const uint16_t* bq, int rstride,
                             ItemPf& pf) {
    T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
    for (int dc = 0; dc < nd; ++dc) {
        ipf_step(pf);
        T_LOAD(6, bq + dc * 512, 64);
        T_LOAD(4, s0 + 32 * dc, rstride);
        T_DP(0, 4, 6);
        if (nb > 1) { T_LOAD(5, s1 + 32 * dc, rstride); T_DP(1, 5, 6); }
        if (nb > 2) { T_LOAD(4, s2 + 32 * dc, rstride); T_DP(2, 4, 6); }
        if (nb > 3) { T_LOAD(5, s3 + 32 * dc, rstride); T_DP(3, 5, 6); }
    }
}

// new limit; k spreads the lines left before it over `steps` steps
static void ipf_retarget(ItemPf& p, int lim, int64_t steps, int ahead) {
    if (ahead <= 0) return;  // k stays 0
    if (lim > p.it->nblocks) lim = p.it->nblocks;
    if (lim > p.lim) p.lim = lim;
    int64_t left = p.cur.total - p.cur.next;
    for (int b = p.b; b < p.lim; ++b) {
        WsPf t;
        ws_pf_init<uint16_t>(t, p.a, p.it, b - 1);
        left += t.total;
    }
    p.k = steps > 0 ? (left + steps - 1) / steps : 0;
}

// token slots a block of n valid tokens takes in a pass
static inline int slots_of(int n, int gpu) { return gpu ? (n + 15) / 16 * 16 : (n + 31) / 32 * 32; }

// end of the pass that starts at block b0
static int pass_end(const WsItem* it, int b0, int cap, int gpu) {
    int used = 0, b = b0;
    for (; b < it->nblocks; ++b) {
        const int n = it->lens[b];
        if (n <= 0) continue;
        const int s = slots_of(n, gpu);
        if (used > 0 && used + s > cap) break;
        used += s;
    }
    return b;
}

// The GPU layout's P.V on V in place (-DWS_PV_PAR, see the header), out of amx_item so that the
// C layout's loops compile as they did without it.
// Tiles [i0, i1) of the pass that end past their block's valid tokens: their V rows, zero-padded,
// into Vs ([tile][16 rows][Dv]; garbage past a block's end would reach O through 0 * NaN).
static __attribute__((noinline)) void par_partial_v(const WsArgs* a, const uint16_t* const* gsrc, const int* gnv,
                                                    int i0, int i1, uint16_t* Vs, int Dv, int64_t tokst) {
    for (int i = i0; i < i1; ++i) {
        if (gnv[i] >= 16) continue;
        uint16_t* dst = Vs + (size_t)i * 16 * Dv;
        for (int t = 0; t < 16; ++t) {
            if (t < gnv[i]) memcpy(dst + (size_t)t * Dv, gsrc[i] + a->v_off + (int64_t)t * tokst, 2 * (size_t)Dv);
            else memset(dst + (size_t)t * Dv, 0, 2 * (size_t)Dv);
        }
    }
}

// tile i's P rows (Pa: [group][16 rows][32 slots]) as two A operands, Pp[i][0] and Pp[i][1]:
// word 2r (even) or 2r + 1 (odd) = P[h][16 (i & 1) + r], the other word 0
static __attribute__((noinline)) void par_p_operands(const uint16_t* Pa, uint16_t* Pp, int nt) {
    for (int i = 0; i < nt; ++i)
        for (int h = 0; h < 16; ++h) {
            const __m512i e = _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i*)(Pa + (i >> 1) * 512 + 32 * h + 16 * (i & 1))));
            _mm512_store_si512((void*)(Pp + i * 1024 + 32 * h), e);
            _mm512_store_si512((void*)(Pp + i * 1024 + 512 + 32 * h), _mm512_slli_epi32(e, 16));
        }
    T_FENCE();
}

// the pass's tiles into C tiles 0-3 (the even and odd values of V's 32 from 16 dc0 on, and of the
// next 32 when nd = 4); B = 16 token rows of V in place (or their zero-padded copy)
static __attribute__((noinline)) void par_pv(const WsArgs* a, const uint16_t* const* gsrc, const int* gnv, int nt,
                                             const uint16_t* Vs, const uint16_t* Pp, int Dv, int dc0, int nd,
                                             long rstride, ItemPf& pf) {
    for (int i = 0; i < nt; ++i) {
        ipf_step(pf);
        const uint16_t* v = gnv[i] < 16 ? Vs + (size_t)i * 16 * Dv + 16 * dc0 : gsrc[i] + a->v_off + 16 * dc0;
        const long vst = gnv[i] < 16 ? (long)Dv * 2 : rstride;
        T_LOAD(4, Pp + i * 1024, 64);
        T_LOAD(5, Pp + i * 1024 + 512, 64);
        T_LOAD(6, v, vst);
        T_DP(0, 4, 6);
        T_DP(1, 5, 6);
        if (nd > 2) { T_LOAD(7, v + 32, vst); T_DP(2, 4, 7); T_DP(3, 5, 7); }
#if WS_PV_PF
        if (i + 1 < nt && gnv[i + 1] == 16) {  // the next tile's V lines, L2 -> L1
            const char* pv = (const char*)(gsrc[i + 1] + a->v_off + 16 * dc0);
            for (int r = 0; r < 16; ++r)
                for (int l = 0; l < nd / 2; ++l) _mm_prefetch(pv + r * rstride + 64 * l, _MM_HINT_T0);
        }
#endif
    }
}

// PAR: the GPU layout's P.V on V in place (pvpar below). A template parameter, so the build
// without it (every C-layout item) is the same code as before the parity form existed.
template <bool PAR>
static void amx_item_t(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dk = a->Dk, Dv = a->Dv, H = a->H;
    const int gpu = a->layout != 0;
    const int nmc = (M + 15) / 16;
    const int nK = gpu ? (Dk + 31) / 32 : Dk / 16;  // Q.K tile steps
    const int nKfull = gpu ? Dk / 32 : nK;         // steps read in place (GPU: the rest via Kt)
    const int nDv = Dv / 16;
    const int64_t tokst = gpu ? (int64_t)H * R : 2 * (int64_t)R;  // elements between A rows
    const long rstride = (long)tokst * 2;                          // same, bytes
    const int cap = (int)(bs > kSB ? ws_round_up(bs, 32) : kSB);
    const int ngmax = cap / 32;
    const size_t bqsz = (size_t)(gpu ? 1 : 2) * nK * 512;  // bf16 elements per 16-row chunk
    // C layout, chunks of more than 8 rows (MLA): Q.K on token-major copies of 32 dims at a time
    // (see the header); their B operand is the GPU layout's, (Dk / 32) x 1 KB per chunk
    const int tmqk = !gpu && WS_QK_TM && Dk % 32 == 0;
    const int nKt = Dk / 32;  // its steps
    // GPU layout, -DWS_PV_PAR=1: P.V with B = 16 token rows of V in place (32 values a row) and
    // A = P with zeros in every other word, once for the even values, once for the odd ones: no
    // pair-interleaved copy of V, twice the products. O is then kept with the even values of each
    // 32 in its first 16 columns and the odd ones in the next 16, and put back in order at the end.
    constexpr bool pvpar = PAR;  // = gpu && WS_PV_PAR && Dv % 32 == 0 (amx_item)

    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    const size_t obq = take(2 * bqsz * nmc), oo = take(4 * (size_t)nmc * 16 * Dv);
    const size_t om = take(4 * (size_t)(2 * nmc * 16 + 16)), os = take(4 * (size_t)cap * 16);
    const size_t opa = take(2 * (size_t)ngmax * 512), oc = take(4 * 4 * 256), ot = take(4 * 16 * 64);
    const size_t okt = take(2 * 8 * 512);
    const size_t opp = take(pvpar ? (size_t)2 * ngmax * 2 * 1024 : 0);  // pvpar: per 16-token tile, P even / odd
    const size_t ov = take(gpu ? 2 * (size_t)ngmax * 16 * Dv * 2 : 2 * (size_t)ngmax * 16 * R * 2);
    const size_t og = take(sizeof(const uint16_t*) * 2 * ngmax + sizeof(int) * 4 * ngmax);
    char* base = ws_scratch(off);
    uint16_t* Bq = (uint16_t*)(base + obq);
    float* O = (float*)(base + oo);
    float* mrun = (float*)(base + om);
    float* lrun = mrun + nmc * 16;
    float* alpha = lrun + nmc * 16;
    float* S = (float*)(base + os);       // [cap slots][16 rows]
    uint16_t* Pa = (uint16_t*)(base + opa);  // [group][16 rows][32 slots]
    float* Ct = (float*)(base + oc);      // 4 C tiles (C layout score unscrambling)
    float* Ot = (float*)(base + ot);      // [16 rows][64 dims]
    uint16_t* Kt = (uint16_t*)(base + okt);  // GPU Dk tail: 4 x [16 tokens][32 dims]; C (tmqk): 2 x that
    uint16_t* Pp = (uint16_t*)(base + opp);  // pvpar: [tile][parity][16 rows][32 words]
    uint16_t* Vs = (uint16_t*)(base + ov);   // GPU: V pairs [group][16][Dv][2]; C: partial groups [group][16][R][2]
    const uint16_t** gsrc = (const uint16_t**)(base + og);  // GPU: per 16-token tile; C: per group
    int* gnv = (int*)(gsrc + 2 * ngmax);                      // valid tokens of each
    int* gblk = gnv + 2 * ngmax;                              // and its block

    // queries -> bf16 B operands, per chunk of 16 rows (rows past M are zero). The items' q
    // carry the factor qs = scale * log2(e); it is divided out first (bf16 queries come back
    // exactly) and the fp32 scores are multiplied by it in the softmax, so q is rounded to bf16
    // once at most, as GPU flash attention does, not after scaling.
    const __m512 vqs = _mm512_set1_ps(a->qs), vinv = _mm512_set1_ps(a->qs != 0.0f ? 1.0f / a->qs : 0.0f);
    alignas(64) uint16_t pq_a[2][32];  // C layout: words 4h'..4h'+3 of B row k <- row 8hg+h'
    for (int x = 0; x < 32; ++x) { pq_a[0][x] = (uint16_t)(x / 4); pq_a[1][x] = (uint16_t)(8 + x / 4); }
    const __m512i pq0 = _mm512_load_si512((const void*)pq_a[0]), pq1 = _mm512_load_si512((const void*)pq_a[1]);
    for (int mc = 0; mc < nmc; ++mc) {
        const int m0 = 16 * mc, mp = M - m0 < 16 ? M - m0 : 16;
        uint16_t* bq = Bq + mc * bqsz;
        __m512i r[16];
        const int tm = gpu || (tmqk && mp > 8);  // B in the GPU layout's form
        for (int dc = 0; dc < (tm ? (Dk + 31) / 32 : nK); ++dc) {
            for (int n = 0; n < 16; ++n) {
                if (n >= mp) { r[n] = _mm512_setzero_si512(); continue; }
                const float* q = it->q + (int64_t)(m0 + n) * Dk;
                if (tm) {  // dword k of row n = (q_n[32dc+2k], q_n[32dc+2k+1])
                    const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(q + 32 * dc), vinv);
                    const __m512 hi = 32 * dc + 16 < Dk ? _mm512_mul_ps(_mm512_loadu_ps(q + 32 * dc + 16), vinv) : _mm512_setzero_ps();
                    r[n] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
                } else {
                    r[n] = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(q + 16 * dc), vinv));
                }
            }
            transpose16(r);
            if (tm) {
                for (int k = 0; k < 16; ++k) _mm512_storeu_si512((void*)(bq + dc * 512 + 32 * k), r[k]);
            } else {  // row k (dim 16dc+k): per row h' of the group, words (q, 0, 0, q)
                for (int k = 0; k < 16; ++k) {
                    const __m512i w = _mm512_zextsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(r[k])));
                    for (int hg = 0; hg < 2; ++hg) {
                        const __m512i v = _mm512_maskz_permutexvar_epi16(0x99999999u, hg ? pq1 : pq0, w);
                        _mm512_storeu_si512((void*)(bq + ((size_t)hg * nK + dc) * 512 + 32 * k), v);
                    }
                }
            }
        }
        for (int x = 0; x < 16; ++x) { mrun[16 * mc + x] = -INFINITY; lrun[16 * mc + x] = 0.0f; }
    }
    memset(O, 0, 4 * (size_t)nmc * 16 * Dv);

    config_tiles();

    const __m512i ilo = ilv16_idx(0), ihi = ilv16_idx(1);
    // de-interleave two tokens: word i of the result = word 2i (iev) or 2i + 1 (iod) of [x | y]
    alignas(64) uint16_t dei_a[2][32];
    for (int i = 0; i < 32; ++i) { dei_a[0][i] = (uint16_t)(2 * i); dei_a[1][i] = (uint16_t)(2 * i + 1); }
    const __m512i iev = _mm512_load_si512((const void*)dei_a[0]), iod = _mm512_load_si512((const void*)dei_a[1]);
    // P interleave: word 2h+j = word 16j+h of [p0 (16 words) | p1 (16 words)]
    alignas(64) uint16_t pidx_a[32];
    for (int h = 0; h < 16; ++h) { pidx_a[2 * h] = (uint16_t)h; pidx_a[2 * h + 1] = (uint16_t)(16 + h); }
    const __m512i pidx = _mm512_load_si512((const void*)pidx_a);
    // the same for 8 rows of two slots: word 2r+j = word 8j+r
    alignas(32) uint16_t pidx8_a[16];
    for (int r = 0; r < 8; ++r) { pidx8_a[2 * r] = (uint16_t)r; pidx8_a[2 * r + 1] = (uint16_t)(8 + r); }
    const __m256i pidx8 = _mm256_load_si256((const __m256i*)pidx8_a);
    // C-layout score unscrambling: token parity j, rows 0-7 from the first tile, 8-15 from the second
    alignas(64) int32_t sidx_a[2][16];
    for (int h = 0; h < 16; ++h)
        for (int j = 0; j < 2; ++j) sidx_a[j][h] = h < 8 ? 2 * h + j : 16 + 2 * (h - 8) + j;
    const __m512i sidx0 = _mm512_load_si512((const void*)sidx_a[0]), sidx1 = _mm512_load_si512((const void*)sidx_a[1]);

    const int ahead = ws_prefetch_blocks();  // blocks the prefetch may run ahead of the reads
    ItemPf pf{a, it, WsPf{}, 1, 1, 0};
    pf.cur.total = pf.cur.next = 0;
#ifdef WS_PHASES
    uint64_t ph_last = __rdtsc();
#endif
    for (int b0 = 0; b0 < it->nblocks;) {
        PH(0);
        const int b1 = pass_end(it, b0, cap, gpu);
        // ---- lay out the pass: GPU: 16-token tiles (2 per group); C: 32-token groups
        int nt = 0;  // GPU tiles or C groups
        for (int b = b0; b < b1; ++b) {
            const int n = it->lens[b];
            if (n <= 0) continue;
            const uint16_t* blk = ws_block_ptr<uint16_t>(a, it->blocks[b], it->head);
            if (gpu) {
                for (int t0 = 0; t0 < n; t0 += 16, ++nt) {
                    gblk[nt] = b;
                    gsrc[nt] = blk + (int64_t)t0 * tokst;
                    gnv[nt] = n - t0 < 16 ? n - t0 : 16;
                }
            } else {
                for (int t0 = 0; t0 < n; t0 += 32, ++nt) {
                    const int nv = n - t0 < 32 ? n - t0 : 32;
                    const uint16_t* src = blk + (int64_t)(t0 / 2) * tokst;
                    gnv[nt] = nv;
                    gblk[nt] = b;
                    if (nv == 32) { gsrc[nt] = src; continue; }
                    // partial group: copy its valid pairs, zero the rest (and an odd last partner)
                    uint16_t* dst = Vs + (size_t)nt * 16 * tokst;
                    const int np = (nv + 1) / 2;
                    memcpy(dst, src, 2 * (size_t)np * tokst);
                    if (nv & 1) {
                        uint16_t* row = dst + (int64_t)(np - 1) * tokst;
                        for (int d = 0; d < R; d += 16) {
                            const __mmask16 mk = R - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (R - d)) - 1);
                            const __m512i x = _mm512_maskz_loadu_epi32(mk, row + 2 * d);
                            _mm512_mask_storeu_epi32(row + 2 * d, mk, _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF)));
                        }
                    }
                    memset(dst + (int64_t)np * tokst, 0, 2 * (size_t)(16 - np) * tokst);
                    gsrc[nt] = dst;
                }
            }
        }
        PH(1);
        if (nt == 0) { b0 = b1; continue; }      // only empty blocks left
        const int ng = gpu ? (nt + 1) / 2 : nt;  // 32-slot groups
        const int e2 = pass_end(it, b1, cap, gpu);  // end of the next pass (prefetch target)
        const int64_t qk_steps = (int64_t)(gpu ? (nt + 3) / 4 : (nt + 1) / 2) * (tmqk && M > 8 ? nKt : nK);  // per row chunk
        const int64_t pv_steps = (int64_t)((nDv + 3) / 4) * (pvpar ? nt : ng);
        // WS_PF_SPREAD: the next pass's lines spread over this whole pass (Q.K and P.V)
        if (WS_PF_SPREAD) ipf_retarget(pf, e2 + ahead - 1, nmc * (pv_steps + qk_steps), ahead);
        for (int mc = 0; mc < nmc; ++mc) {
            const int mp = M - 16 * mc < 16 ? M - 16 * mc : 16;
            const uint16_t* bq = Bq + mc * bqsz;
            T_FENCE();  // Bq, partial-group copies
            // ---- Q.K -> S[slot][row]
            if (gpu) {
                for (int i0 = 0; i0 < nt; i0 += 4) {
                    const int nb = nt - i0 < 4 ? nt - i0 : 4;
                    if (mc == 0 && !WS_PF_SPREAD) ipf_retarget(pf, gblk[i0 + nb - 1] + 1 + ahead, nK, ahead);
                    const uint16_t* s0 = gsrc[i0] + a->k_off;
                    const uint16_t* s1 = nb > 1 ? gsrc[i0 + 1] + a->k_off : s0;
                    const uint16_t* s2 = nb > 2 ? gsrc[i0 + 2] + a->k_off : s0;
                    const uint16_t* s3 = nb > 3 ? gsrc[i0 + 3] + a->k_off : s0;
                    qk_groups(s0, s1, s2, s3, nb, nKfull, bq, rstride, pf);
                    if (nKfull < nK) {  // last 16 dims: zero-padded copies (B rows 8-15 are 0)
                        for (int i = 0; i < nb; ++i)
                            for (int t = 0; t < 16; ++t) {
                                const __m256i x = _mm256_loadu_si256((const __m256i*)(gsrc[i0 + i] + a->k_off + 32 * nKfull + t * tokst));
                                _mm512_store_si512((void*)(Kt + i * 512 + 32 * t), _mm512_zextsi256_si512(x));
                            }
                        T_FENCE();
                        ipf_step(pf);
                        T_LOAD(6, bq + nKfull * 512, 64);
                        T_LOAD(4, Kt, 64);
                        T_DP(0, 4, 6);
                        if (nb > 1) { T_LOAD(5, Kt + 512, 64); T_DP(1, 5, 6); }
                        if (nb > 2) { T_LOAD(4, Kt + 1024, 64); T_DP(2, 4, 6); }
                        if (nb > 3) { T_LOAD(5, Kt + 1536, 64); T_DP(3, 5, 6); }
                    }
                    T_STORE(0, S + (i0 + 0) * 256, 64);
                    if (nb > 1) T_STORE(1, S + (i0 + 1) * 256, 64);
                    if (nb > 2) T_STORE(2, S + (i0 + 2) * 256, 64);
                    if (nb > 3) T_STORE(3, S + (i0 + 3) * 256, 64);
                    if (mc == 0 && pvpar) {  // read in place; a tile past its block's end -> zero-padded copy
                        par_partial_v(a, gsrc, gnv, i0, i0 + nb, Vs, Dv, tokst);
                    } else if (mc == 0) {  // V of these tokens -> pair-interleaved scratch (once per pass)
                        for (int i = i0; i < i0 + nb; ++i) {
                            const uint16_t* src = gsrc[i] + a->v_off;
                            uint16_t* dst = Vs + (size_t)(i / 2) * 16 * Dv * 2 + (size_t)(i & 1) * 8 * Dv * 2;
                            for (int p = 0; p < 8; ++p) {
                                const bool v0 = 2 * p < gnv[i], v1 = 2 * p + 1 < gnv[i];
                                const uint16_t* r0 = src + (int64_t)(2 * p) * tokst;
                                const uint16_t* r1 = r0 + tokst;
                                uint16_t* o = dst + (size_t)p * Dv * 2;
                                int d = 0;
                                for (; d + 32 <= Dv; d += 32) {
                                    const __m512i x = v0 ? _mm512_loadu_si512((const void*)(r0 + d)) : _mm512_setzero_si512();
                                    const __m512i y = v1 ? _mm512_loadu_si512((const void*)(r1 + d)) : _mm512_setzero_si512();
                                    _mm512_storeu_si512((void*)(o + 2 * d), _mm512_permutex2var_epi16(x, ilo, y));
                                    _mm512_storeu_si512((void*)(o + 2 * d + 32), _mm512_permutex2var_epi16(x, ihi, y));
                                }
                                if (d < Dv) {
                                    const __m512i x = v0 ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(r0 + d))) : _mm512_setzero_si512();
                                    const __m512i y = v1 ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(r1 + d))) : _mm512_setzero_si512();
                                    _mm512_storeu_si512((void*)(o + 2 * d), _mm512_permutex2var_epi16(x, ilo, y));
                                }
                            }
                        }
                        if ((i0 + nb) == nt && (nt & 1))  // the last group's empty second half
                            memset(Vs + (size_t)(nt / 2) * 16 * Dv * 2 + 8 * (size_t)Dv * 2, 0, 2 * 8 * (size_t)Dv * 2);
                    }
                }
            } else if (tmqk && mp > 8) {  // token-major copies, four 16-token tiles per step
                for (int g0 = 0; g0 < nt; g0 += 2) {
                    const int two = nt - g0 > 1;
                    if (mc == 0 && !WS_PF_SPREAD) ipf_retarget(pf, gblk[g0 + two] + 1 + ahead, nKt, ahead);
                    const uint16_t* s0 = gsrc[g0] + 2 * a->k_off;
                    const uint16_t* s1 = two ? gsrc[g0 + 1] + 2 * a->k_off : s0;
                    T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
                    for (int dc = 0; dc < nKt; ++dc) {
                        ipf_step(pf);
                        // pair row p of group g (32 dims of tokens 2p, 2p+1 interleaved) -> rows
                        // 2p, 2p+1 (mod 16) of tile 2g + p / 8; two buffers, so this step's
                        // stores never wait for the tile loads of the step before
                        uint16_t* kt = Kt + (dc & 1) * 2048;
                        T_FENCE();
                        for (int g = 0; g <= two; ++g) {
                            const uint16_t* src = (g ? s1 : s0) + 64 * dc;
                            for (int p = 0; p < 16; ++p) {
                                const __m512i x = _mm512_loadu_si512((const void*)(src + p * tokst));
                                const __m512i y = _mm512_loadu_si512((const void*)(src + p * tokst + 32));
                                uint16_t* dst = kt + (2 * g + (p >> 3)) * 512 + 64 * (p & 7);
                                _mm512_store_si512((void*)dst, _mm512_permutex2var_epi16(x, iev, y));
                                _mm512_store_si512((void*)(dst + 32), _mm512_permutex2var_epi16(x, iod, y));
                            }
                        }
                        T_FENCE();
                        T_LOAD(6, bq + dc * 512, 64);
                        T_LOAD(4, kt, 64); T_DP(0, 4, 6);
                        T_LOAD(5, kt + 512, 64); T_DP(1, 5, 6);
                        if (two) { T_LOAD(4, kt + 1024, 64); T_DP(2, 4, 6); T_LOAD(5, kt + 1536, 64); T_DP(3, 5, 6); }
#if WS_QK_PF
                        {  // the next step's 128 bytes of each pair row (the next two groups' first), L2 -> L1
                            int gn = g0, dn = dc + 1;
                            if (dn == nKt) { gn = g0 + 2; dn = 0; }
                            for (int g = gn; g < gn + 2 && g < nt; ++g) {
                                const char* src = (const char*)(gsrc[g] + 2 * a->k_off + 64 * dn);
                                for (int p = 0; p < 16; ++p) {
                                    _mm_prefetch(src + (long)p * rstride, _MM_HINT_T0);
                                    _mm_prefetch(src + (long)p * rstride + 64, _MM_HINT_T0);
                                }
                            }
                        }
#endif
                    }
                    float* sg = S + (size_t)g0 * 32 * 16;
                    T_STORE(0, sg, 64);
                    T_STORE(1, sg + 256, 64);
                    if (two) { T_STORE(2, sg + 512, 64); T_STORE(3, sg + 768, 64); }
                }
            } else if (mp > 8) {  // two 8-row B tiles, two groups per step
                for (int g0 = 0; g0 < nt; g0 += 2) {
                    const int two = nt - g0 > 1;
                    if (mc == 0 && !WS_PF_SPREAD) ipf_retarget(pf, gblk[g0 + two] + 1 + ahead, nK, ahead);
                    const uint16_t* s0 = gsrc[g0] + 2 * a->k_off;
                    const uint16_t* s1 = two ? gsrc[g0 + 1] + 2 * a->k_off : s0;
                    T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
                    for (int dc = 0; dc < nK; ++dc) {
                        ipf_step(pf);
                        T_LOAD(6, bq + dc * 512, 64);
                        T_LOAD(7, bq + (nK + dc) * 512, 64);
                        T_LOAD(4, s0 + 32 * dc, rstride);
                        T_DP(0, 4, 6);
                        T_DP(1, 4, 7);
                        if (two) {
                            T_LOAD(5, s1 + 32 * dc, rstride);
                            T_DP(2, 5, 6);
                            T_DP(3, 5, 7);
                        }
                    }
                    T_STORE(0, Ct, 64);
                    T_STORE(1, Ct + 256, 64);
                    if (two) { T_STORE(2, Ct + 512, 64); T_STORE(3, Ct + 768, 64); }
                    for (int g = 0; g <= two; ++g)
                        for (int p = 0; p < 16; ++p) {
                            const __m512 c0 = _mm512_load_ps(Ct + g * 512 + 16 * p), c1 = _mm512_load_ps(Ct + g * 512 + 256 + 16 * p);
                            float* s = S + ((g0 + g) * 32 + 2 * p) * 16;
                            _mm512_store_ps(s, _mm512_permutex2var_ps(c0, sidx0, c1));
                            _mm512_store_ps(s + 16, _mm512_permutex2var_ps(c0, sidx1, c1));
                        }
                }
            } else {  // one 8-row B tile, four groups per step
                for (int g0 = 0; g0 < nt; g0 += 4) {
                    const int nb = nt - g0 < 4 ? nt - g0 : 4;
                    if (mc == 0 && !WS_PF_SPREAD) ipf_retarget(pf, gblk[g0 + nb - 1] + 1 + ahead, nK, ahead);
                    const uint16_t* s0 = gsrc[g0] + 2 * a->k_off;
                    const uint16_t* s1 = nb > 1 ? gsrc[g0 + 1] + 2 * a->k_off : s0;
                    const uint16_t* s2 = nb > 2 ? gsrc[g0 + 2] + 2 * a->k_off : s0;
                    const uint16_t* s3 = nb > 3 ? gsrc[g0 + 3] + 2 * a->k_off : s0;
                    qk_groups(s0, s1, s2, s3, nb, nK, bq, rstride, pf);
                    T_STORE(0, Ct, 64);
                    if (nb > 1) T_STORE(1, Ct + 256, 64);
                    if (nb > 2) T_STORE(2, Ct + 512, 64);
                    if (nb > 3) T_STORE(3, Ct + 768, 64);
                    const __m512 z = _mm512_setzero_ps();
                    for (int g = 0; g < nb; ++g)
                        for (int p = 0; p < 16; ++p) {
                            const __m512 c0 = _mm512_load_ps(Ct + g * 256 + 16 * p);
                            float* s = S + ((g0 + g) * 32 + 2 * p) * 16;
                            _mm512_store_ps(s, _mm512_permutex2var_ps(c0, sidx0, z));
                            _mm512_store_ps(s + 16, _mm512_permutex2var_ps(c0, sidx1, z));
                        }
                }
            }
            PH(2);
            // ---- online softmax over the pass (vertical over slots), P -> A operand
            // valid slots: group g, half h: rows < nv(g, h)
            auto nvalid = [&](int g, int h) -> int {
                if (gpu) { const int i = 2 * g + h; return i < nt ? gnv[i] : 0; }
                const int v = gnv[g] - 16 * h;
                return v < 0 ? 0 : v > 16 ? 16 : v;
            };
            // four independent max chains (one chain of 16 per group would bound this loop by
            // the max's latency)
            __m512 mxa[4];
            for (int j = 0; j < 4; ++j) mxa[j] = _mm512_set1_ps(-INFINITY);
            for (int g = 0; g < ng; ++g)
                for (int h = 0; h < 2; ++h) {
                    const int nv = nvalid(g, h);
                    const float* s = S + (g * 32 + h * 16) * 16;
                    int t = 0;
                    for (; t + 4 <= nv; t += 4)
                        for (int j = 0; j < 4; ++j) mxa[j] = _mm512_max_ps(mxa[j], _mm512_mul_ps(_mm512_load_ps(s + 16 * (t + j)), vqs));
                    for (; t < nv; ++t) mxa[0] = _mm512_max_ps(mxa[0], _mm512_mul_ps(_mm512_load_ps(s + 16 * t), vqs));
                }
            const __m512 mx = _mm512_max_ps(_mm512_max_ps(mxa[0], mxa[1]), _mm512_max_ps(mxa[2], mxa[3]));
            const __m512 mold = _mm512_loadu_ps(mrun + 16 * mc);
            const __m512 mnew = _mm512_max_ps(mold, mx);
            const __mmask16 first = _mm512_cmp_ps_mask(mold, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
            const __m512 al = _mm512_maskz_mov_ps((__mmask16)~first, exp2_fast(_mm512_sub_ps(mold, mnew)));
            __m512 sums[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            // at most 8 rows: two slots share one exp (rows of slot 2k in lanes 0-7, of slot
            // 2k+1 in lanes 8-15), and P's rows 8-15 are zero
            const __m512 mnew2 = _mm512_shuffle_f32x4(mnew, mnew, _MM_SHUFFLE(1, 0, 1, 0));
            for (int g = 0; g < ng && mp <= 8; ++g) {
                const int nv0 = nvalid(g, 0), nv1 = nvalid(g, 1);
                __m512i w[16];
                for (int k = 0; k < 16; ++k) {
                    const int h = k >> 3, t = 2 * (k & 7), nv = h ? nv1 : nv0;
                    const __mmask16 valid = (__mmask16)((t < nv ? 0x00FFu : 0u) | (t + 1 < nv ? 0xFF00u : 0u));
                    const float* s = S + (g * 32 + 16 * h + t) * 16;
                    const __m512 x = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(s)), _mm256_load_ps(s + 16), 1);
                    const __m512 e = _mm512_maskz_mov_ps(valid, exp2_fast(_mm512_fmsub_ps(x, vqs, mnew2)));
                    sums[k & 1] = _mm512_add_ps(sums[k & 1], e);
                    const __m256i pb = (__m256i)_mm512_cvtneps_pbh(e);  // words r, 8 + r: rows r of the two slots
                    w[k] = _mm512_zextsi256_si512(_mm256_permutexvar_epi16(pidx8, pb));
                }
                transpose16(w);  // row h: dword k = (P[h][2k], P[h][2k+1])
                for (int h = 0; h < 16; ++h) _mm512_store_si512((void*)(Pa + g * 512 + 32 * h), w[h]);
            }
            if (mp <= 8)  // lanes 0-7: the two slots' sums of rows 0-7 (lanes 8-15 are not used)
                for (int j = 0; j < 2; ++j)
                    sums[j] = _mm512_add_ps(sums[j], _mm512_shuffle_f32x4(sums[j], sums[j], _MM_SHUFFLE(1, 0, 3, 2)));
            for (int g = 0; g < ng && mp > 8; ++g) {
                const int nv0 = nvalid(g, 0), nv1 = nvalid(g, 1);
                __m512i w[16];
                for (int k = 0; k < 16; ++k) {
                    const int h = k >> 3, t = 2 * (k & 7), nv = h ? nv1 : nv0;
                    const float* s = S + (g * 32 + 16 * h + t) * 16;
                    const __m512 p0 = t < nv ? exp2_fast(_mm512_fmsub_ps(_mm512_load_ps(s), vqs, mnew)) : _mm512_setzero_ps();
                    const __m512 p1 = t + 1 < nv ? exp2_fast(_mm512_fmsub_ps(_mm512_load_ps(s + 16), vqs, mnew)) : _mm512_setzero_ps();
                    sums[k & 1] = _mm512_add_ps(sums[k & 1], _mm512_add_ps(p0, p1));
                    w[k] = _mm512_permutexvar_epi16(pidx, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
                }
                transpose16(w);  // row h: dword k = (P[h][2k], P[h][2k+1])
                for (int h = 0; h < 16; ++h) _mm512_store_si512((void*)(Pa + g * 512 + 32 * h), w[h]);
            }
            const __m512 sum = _mm512_add_ps(sums[0], sums[1]);
            _mm512_storeu_ps(lrun + 16 * mc, _mm512_fmadd_ps(_mm512_loadu_ps(lrun + 16 * mc), al, sum));
            _mm512_storeu_ps(mrun + 16 * mc, mnew);
            _mm512_storeu_ps(alpha, al);
            const bool accumulate = _mm512_cmp_ps_mask(al, _mm512_set1_ps(1.0f), _CMP_EQ_OQ) == 0xFFFF;
            if (pvpar) par_p_operands(Pa, Pp, nt);
            PH(3);
            // ---- P.V into O
            T_FENCE();  // P, the V scratch, O
            if (mc == 0) ipf_retarget(pf, e2 + ahead - 1, nmc * pv_steps + (nmc - 1) * qk_steps, ahead);
            float* Oc = O + (size_t)mc * 16 * Dv;
            for (int dc0 = 0; dc0 < nDv; dc0 += 4) {
                const int nd = nDv - dc0 < 4 ? nDv - dc0 : 4;
                float* o0 = Oc + 16 * dc0;
                if (accumulate) {
                    T_LOAD(0, o0, Dv * 4);
                    if (nd > 1) T_LOAD(1, o0 + 16, Dv * 4);
                    if (nd > 2) T_LOAD(2, o0 + 32, Dv * 4);
                    if (nd > 3) T_LOAD(3, o0 + 48, Dv * 4);
                } else {
                    T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
                }
                if (pvpar) par_pv(a, gsrc, gnv, nt, Vs, Pp, Dv, dc0, nd, rstride, pf);
                else for (int g = 0; g < ng; ++g) {
                    ipf_step(pf);
                    const uint16_t* v;
                    long vst;
                    if (gpu) { v = Vs + (size_t)g * 16 * Dv * 2 + 32 * dc0; vst = (long)Dv * 4; }
                    else { v = gsrc[g] + 2 * (a->v_off + 16 * dc0); vst = rstride; }
                    T_LOAD(4, Pa + g * 512, 64);
                    T_LOAD(6, v, vst);
                    T_DP(0, 4, 6);
                    if (nd > 1) { T_LOAD(7, v + 32, vst); T_DP(1, 4, 7); }
                    if (nd > 2) { T_LOAD(6, v + 64, vst); T_DP(2, 4, 6); }
                    if (nd > 3) { T_LOAD(7, v + 96, vst); T_DP(3, 4, 7); }
#if WS_PV_PF
                    if (!gpu) {  // the next group's V lines, L2 -> L1, under this group's products
                        int gn = g + 1, dn = dc0;
                        if (gn == ng) { gn = 0; dn = dc0 + 4; }
                        if (dn < nDv) {
                            const char* pv = (const char*)(gsrc[gn] + 2 * (a->v_off + 16 * dn));
                            const int nl = nDv - dn < 4 ? nDv - dn : 4;  // 64-byte lines per pair row
                            for (int r = 0; r < 16; ++r)
                                for (int l = 0; l < nl; ++l) _mm_prefetch(pv + r * rstride + 64 * l, _MM_HINT_T0);
                        }
                    }
#endif
                }
                if (accumulate) {
                    T_STORE(0, o0, Dv * 4);
                    if (nd > 1) T_STORE(1, o0 + 16, Dv * 4);
                    if (nd > 2) T_STORE(2, o0 + 32, Dv * 4);
                    if (nd > 3) T_STORE(3, o0 + 48, Dv * 4);
                } else {  // O = alpha * O + tile
                    T_STORE(0, Ot, 256);
                    if (nd > 1) T_STORE(1, Ot + 16, 256);
                    if (nd > 2) T_STORE(2, Ot + 32, 256);
                    if (nd > 3) T_STORE(3, Ot + 48, 256);
                    for (int h = 0; h < 16; ++h) {
                        const __m512 ah = _mm512_set1_ps(alpha[h]);
                        float* o = o0 + (size_t)h * Dv;
                        for (int j = 0; j < nd; ++j)
                            _mm512_storeu_ps(o + 16 * j, _mm512_fmadd_ps(_mm512_loadu_ps(o + 16 * j), ah, _mm512_load_ps(Ot + 64 * h + 16 * j)));
                    }
                }
            }
        }
        PH(4);
        b0 = b1;
    }
    T_RELEASE();
    for (int mc = 0; mc < nmc; ++mc) {
        const int m0 = 16 * mc, mp = M - m0 < 16 ? M - m0 : 16;
        for (int m = 0; m < mp; ++m) {
            const float* om = O + ((size_t)mc * 16 + m) * Dv;
            float* out = it->o + (int64_t)(m0 + m) * Dv;
            if (pvpar) {  // each 32 values: the even ones, then the odd ones -> in order
                const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
                for (int d = 0; d < Dv; d += 32) {
                    const __m512 ev = _mm512_load_ps(om + d), od = _mm512_load_ps(om + d + 16);
                    _mm512_storeu_ps(out + d, _mm512_permutex2var_ps(ev, i0, od));
                    _mm512_storeu_ps(out + d + 16, _mm512_permutex2var_ps(ev, i1, od));
                }
            } else {
                memcpy(out, om, 4 * (size_t)Dv);
            }
            it->m[m0 + m] = mrun[16 * mc + m];
            it->l[m0 + m] = lrun[16 * mc + m];
        }
    }
}

}  // namespace

static void amx_item(const WsArgs* a, const WsItem* it) {
    if (a->layout != 0 && WS_PV_PAR && a->Dv % 32 == 0) amx_item_t<true>(a, it);
    else amx_item_t<false>(a, it);
}

// GPU layout: 16-token tiles read in place, so bs % 16 == 0; C layout: 32-token pair groups.
int ws_amx_eligible(const WsArgs* a) {
    return a->dtype == 1 && a->Dk % 16 == 0 && a->Dv % 16 == 0 && a->bs % (a->layout == 0 ? 32 : 16) == 0;
}

void ws_item_amx(const WsArgs* a, const WsItem* it) {
    if (ws_amx_eligible(a)) amx_item(a, it);
    else ws_item_dispatch(a, it);
}

// One thread's part of the tile-load read probe (ws_tile_read_seconds in attn_ops.cpp times it):
// tiles [t0, t1) of the 1 KB tiles at x (16 rows x 64 bytes, contiguous) loaded into two A tiles
// in turn, one TDPBF16PS each into four accumulators. `ahead` > 0: before each group of four,
// PREFETCHT1 of the lines `ahead` tiles further on (the kernel's software prefetch into L2); 0:
// the hardware prefetchers alone. B is all bf16 ones, so element (0, 0) of the accumulators
// sums the 32 bf16 values of every tile's first row: the return value (a checksum) shows every
// tile was read where it lies. The caller checks for AMX and has the tile data permission.
double ws_tile_stream(const void* x, int64_t t0, int64_t t1, int64_t ahead) {
    config_tiles();
    alignas(64) uint16_t ones[512];
    for (int k = 0; k < 512; ++k) ones[k] = 0x3F80;  // bf16 1.0
    T_FENCE();
    T_ZERO(0); T_ZERO(1); T_ZERO(2); T_ZERO(3);
    T_LOAD(6, ones, 64);
    const char* p = (const char*)x;
    int64_t i = t0;
    for (; i + 4 <= t1; i += 4) {
        if (ahead && i + ahead + 4 <= t1)
            for (int l = 0; l < 64; ++l) _mm_prefetch(p + 1024 * (i + ahead) + 64 * l, _MM_HINT_T1);
        T_LOAD(4, p + 1024 * i, 64); T_DP(0, 4, 6);
        T_LOAD(5, p + 1024 * (i + 1), 64); T_DP(1, 5, 6);
        T_LOAD(4, p + 1024 * (i + 2), 64); T_DP(2, 4, 6);
        T_LOAD(5, p + 1024 * (i + 3), 64); T_DP(3, 5, 6);
    }
    for (; i < t1; ++i) { T_LOAD(4, p + 1024 * i, 64); T_DP(0, 4, 6); }
    alignas(64) float c[4][256];
    T_STORE(0, c[0], 64);
    T_STORE(1, c[1], 64);
    T_STORE(2, c[2], 64);
    T_STORE(3, c[3], 64);
    T_RELEASE();
    return (double)c[0][0] + c[1][0] + c[2][0] + c[3][0];
}
