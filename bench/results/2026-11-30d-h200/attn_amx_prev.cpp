// AMX-BF16 build: both matrix products of a block on the tile unit, softmax in AVX-512.
//
// The C layout's token pairs ([bs/2][R][2]) are exactly the "VNNI" operand format of
// TDPBF16PS, so every operand is loaded from the pool in place:
//   P.V:  O[16 q][16 d] += P[16 q][32 t] . V, with V's B tile = 16 token-pair rows of 16 dims
//         x 2 tokens, read straight from the block (row stride R*4 bytes);
//   Q.K:  the block is the A operand: 16 token-pair rows of 16 dims x 2 tokens. A B operand
//         with q_h[d] in the slot of parity j and 0 in the other gives
//         C[pair][(h, j)] = score of token 2*pair + j for head h, 8 heads per tile. Half the
//         products multiply zeros, which the tile unit has ample rate for (decode attention
//         needs ~30 FLOP/byte for MLA; TDPBF16PS gives ~1000 FLOP/cycle/core).
// Intel's AMX programming reference and oneDNN's brgemm kernels were read for the tile
// configuration and the VNNI operand format; the kernel is our own.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")
#include "attn_common.h"
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static inline uint16_t f2bf(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void amx_item(const WsArgs* a, const WsItem* it) {
    const int M = it->M, R = a->R, bs = a->bs, Dk = a->Dk, Dv = a->Dv;
    const int nDk = Dk / 16, nDv = Dv / 16;
    size_t off = 0;
    auto take = [&](size_t bytes) { size_t o = off; off += (size_t)ws_round_up((int64_t)bytes, 64); return o; };
    size_t obq = take(2 * 2 * (size_t)nDk * 512), osr = take(4 * 512), os = take(4 * 16 * (size_t)bs);
    size_t op = take(2 * 16 * (size_t)bs), oo = take(4 * 16 * (size_t)Dv), om = take(4 * 48);
    size_t ot = take(2 * (size_t)bs * R);
    char* base = ws_scratch(off);
    uint16_t* Bq = (uint16_t*)(base + obq);
    float* Sraw = (float*)(base + osr);
    float* S = (float*)(base + os);
    uint16_t* P = (uint16_t*)(base + op);
    float* O = (float*)(base + oo);
    float* mrun = (float*)(base + om);
    float* lrun = mrun + 16;
    float* alpha = lrun + 16;
    uint16_t* tilebuf = (uint16_t*)(base + ot);

    TileCfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);

    for (int m0 = 0; m0 < M; m0 += 16) {
        const int mp = M - m0 < 16 ? M - m0 : 16;
        const int nhg = (mp + 7) / 8;
        memset(Bq, 0, 2 * 2 * (size_t)nDk * 512);
        for (int hg = 0; hg < nhg; ++hg)
            for (int dc = 0; dc < nDk; ++dc) {
                uint16_t* b = Bq + ((size_t)hg * nDk + dc) * 512;
                for (int rr = 0; rr < 16; ++rr)
                    for (int c = 0; c < 16; ++c) {
                        int m = hg * 8 + c / 2;
                        if (m < mp) b[(rr * 16 + c) * 2 + (c & 1)] = f2bf(it->q[(int64_t)(m0 + m) * Dk + 16 * dc + rr]);
                    }
            }
        memset(P, 0, 2 * 16 * (size_t)bs);
        memset(O, 0, 4 * 16 * (size_t)Dv);
        for (int r = 0; r < 16; ++r) { mrun[r] = -INFINITY; lrun[r] = 0.0f; }

        for (int bi = 0; bi < it->nblocks; ++bi) {
            const int n = it->lens[bi];
            if (n <= 0) continue;
            const uint16_t* tile = ws_block_ptr<uint16_t>(a, it->blocks[bi], it->head);
            if (a->layout != 0 || n != bs) {
                ws_repack<uint16_t>(a, tile, n, bs, tilebuf);
                tile = tilebuf;
            }
            const int ntg = (n + 31) / 32;
            WsPf pf;
            ws_pf_init<uint16_t>(pf, a, it, bi);
            const int64_t pf_steps = (int64_t)ntg * nDk + nDv;
            const int64_t pf_k = (pf.total + pf_steps - 1) / pf_steps;
            for (int tg = 0; tg < ntg; ++tg) {
                const uint16_t* arow = tile + ((int64_t)(16 * tg) * R + a->k_off) * 2;
                _tile_zero(0);
                _tile_zero(1);
                for (int dc = 0; dc < nDk; ++dc) {
                    ws_pf_step(pf, pf_k);
                    _tile_loadd(2, arow + 32 * dc, R * 4);
                    _tile_loadd(3, Bq + (size_t)dc * 512, 64);
                    _tile_dpbf16ps(0, 2, 3);
                    if (nhg > 1) {
                        _tile_loadd(4, Bq + ((size_t)nDk + dc) * 512, 64);
                        _tile_dpbf16ps(1, 2, 4);
                    }
                }
                _tile_stored(0, Sraw, 64);
                if (nhg > 1) _tile_stored(1, Sraw + 256, 64);
                for (int hg = 0; hg < nhg; ++hg)
                    for (int c = 0; c < 16; ++c) {
                        int m = hg * 8 + c / 2;
                        if (m >= mp) break;
                        float* s = S + (int64_t)m * bs + 32 * tg + (c & 1);
                        const float* src = Sraw + hg * 256 + c;
                        for (int row = 0; row < 16; ++row) s[2 * row] = src[row * 16];
                    }
            }
            const int npad = 32 * ntg;
            ws_softmax_block(mp, n, npad, S, bs, mrun, lrun, alpha);
            for (int m = 0; m < mp; ++m) {
                const float* s = S + (int64_t)m * bs;
                uint16_t* p = P + (int64_t)m * bs;
                for (int t = 0; t < npad; t += 32) {
                    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + t + 16), _mm512_loadu_ps(s + t));
                    _mm512_storeu_si512((void*)(p + t), (__m512i)v);
                }
                if (alpha[m] != 1.0f) {
                    __m512 al = _mm512_set1_ps(alpha[m]);
                    float* o = O + (int64_t)m * Dv;
                    for (int d = 0; d < Dv; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), al));
                }
            }
            const uint16_t* vbase = tile + (int64_t)a->v_off * 2;
            for (int dc = 0; dc < nDv; ++dc) {
                ws_pf_step(pf, pf_k);
                _tile_loadd(5, O + 16 * dc, Dv * 4);
                for (int tg = 0; tg < ntg; ++tg) {
                    _tile_loadd(6, P + 32 * tg, bs * 2);
                    _tile_loadd(7, vbase + ((int64_t)(16 * tg) * R + 16 * dc) * 2, R * 4);
                    _tile_dpbf16ps(5, 6, 7);
                }
                _tile_stored(5, O + 16 * dc, Dv * 4);
            }
        }
        for (int m = 0; m < mp; ++m) {
            memcpy(it->o + (int64_t)(m0 + m) * Dv, O + (int64_t)m * Dv, 4 * (size_t)Dv);
            it->m[m0 + m] = mrun[m];
            it->l[m0 + m] = lrun[m];
        }
    }
    _tile_release();
}

}  // namespace

int ws_amx_eligible(const WsArgs* a) {
    return a->dtype == 1 && a->bs % 32 == 0 && a->Dk % 16 == 0 && a->Dv % 16 == 0;
}

void ws_item_amx(const WsArgs* a, const WsItem* it) {
    if (ws_amx_eligible(a)) amx_item(a, it);
    else ws_item_dispatch(a, it);
}
