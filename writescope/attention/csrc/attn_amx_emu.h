// TEST ONLY: a portable, slow emulation of the AMX tile operations attn_amx.cpp uses, so the AMX
// kernel's indexing and numerics can be checked on a machine without AMX. Included by
// attn_amx.cpp only when it is compiled with -DWS_AMX_EMULATE (tests/test_cpu_attention_amx_emu.py
// builds such a library on the side); the production build never defines it.
//
// Modelled (after the TILECFG / TILELOADD / TILESTORED / TILEZERO / TDPBF16PS descriptions in
// Intel's SDM and AMX programming reference): palette 1 with 8 tiles of at most 16 rows x 64
// bytes, the config checks that raise #GP/#UD there (abort here), rows and columns beyond the
// configured shape read as zero, the shape rules of TDPBF16PS (C rows = A rows, A colsb / 4 = B
// rows, C colsb = B colsb, three distinct tiles), and its arithmetic: for each k the even then the
// odd bf16 product is added to the fp32 accumulator with round-to-nearest-even, bf16 denormal
// inputs read as zero and denormal results flushed to zero.
// Not modelled: timing, the hardware's actual internal summation order (it may differ from the
// SDM pseudo-code in the last bit), the XFD permission request, and faults on unmapped memory.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct WsEmuTiles {
    alignas(64) uint8_t t[8][16][64];
    uint8_t rows[8];
    uint16_t colsb[8];
    int configured;
};
static thread_local WsEmuTiles g_ws_emu;

[[noreturn]] static void ws_emu_fail(const char* what) {
    fprintf(stderr, "AMX emulation: %s\n", what);
    abort();
}

static void ws_emu_loadconfig(const void* p) {
    const uint8_t* c = (const uint8_t*)p;
    if (c[0] != 1) ws_emu_fail("palette must be 1");
    if (c[1] != 0) ws_emu_fail("start_row must be 0");
    for (int i = 2; i < 16; ++i)
        if (c[i]) ws_emu_fail("reserved config bytes must be 0");
    for (int t = 0; t < 16; ++t) {
        const int colsb = c[16 + 2 * t] | (c[17 + 2 * t] << 8), rows = c[48 + t];
        if (t >= 8) {
            if (colsb || rows) ws_emu_fail("palette 1 has 8 tiles");
            continue;
        }
        if (colsb > 64 || rows > 16) ws_emu_fail("tile larger than 16 rows x 64 bytes");
        if ((colsb == 0) != (rows == 0)) ws_emu_fail("tile with rows but no columns or vice versa");
        g_ws_emu.rows[t] = (uint8_t)rows;
        g_ws_emu.colsb[t] = (uint16_t)colsb;
    }
    memset(g_ws_emu.t, 0, sizeof g_ws_emu.t);
    g_ws_emu.configured = 1;
}

static inline void ws_emu_check(int t) {
    if (!g_ws_emu.configured) ws_emu_fail("tile used without a loaded config");
    if (t < 0 || t >= 8 || g_ws_emu.rows[t] == 0) ws_emu_fail("tile not configured");
}

static void ws_emu_loadd(int t, const void* base, long stride) {
    ws_emu_check(t);
    memset(g_ws_emu.t[t], 0, sizeof g_ws_emu.t[t]);
    for (int r = 0; r < g_ws_emu.rows[t]; ++r)
        memcpy(g_ws_emu.t[t][r], (const char*)base + (long)r * stride, g_ws_emu.colsb[t]);
}

static void ws_emu_stored(int t, void* base, long stride) {
    ws_emu_check(t);
    for (int r = 0; r < g_ws_emu.rows[t]; ++r)
        memcpy((char*)base + (long)r * stride, g_ws_emu.t[t][r], g_ws_emu.colsb[t]);
}

static void ws_emu_zero(int t) {
    ws_emu_check(t);
    memset(g_ws_emu.t[t], 0, sizeof g_ws_emu.t[t]);
}

static inline float ws_emu_bf16(const uint8_t* p) {  // bf16 -> fp32, denormals read as zero
    uint32_t u = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float ws_emu_ftz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}

static void ws_emu_dpbf16ps(int c, int a, int b) {
    ws_emu_check(c);
    ws_emu_check(a);
    ws_emu_check(b);
    if (c == a || c == b || a == b) ws_emu_fail("TDPBF16PS needs three distinct tiles");
    const int M = g_ws_emu.rows[c], N = g_ws_emu.colsb[c] / 4, K = g_ws_emu.colsb[a] / 4;
    if (g_ws_emu.rows[a] != M || g_ws_emu.rows[b] != K || g_ws_emu.colsb[b] != g_ws_emu.colsb[c] ||
        g_ws_emu.colsb[a] % 4 || g_ws_emu.colsb[c] % 4)
        ws_emu_fail("TDPBF16PS shape mismatch");
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc;
            memcpy(&acc, &g_ws_emu.t[c][m][4 * n], 4);
            for (int k = 0; k < K; ++k) {
                const float p0 = ws_emu_bf16(&g_ws_emu.t[a][m][4 * k]) * ws_emu_bf16(&g_ws_emu.t[b][k][4 * n]);
                acc = ws_emu_ftz(acc + p0);  // products of two bf16 are exact in fp32
                const float p1 = ws_emu_bf16(&g_ws_emu.t[a][m][4 * k + 2]) * ws_emu_bf16(&g_ws_emu.t[b][k][4 * n + 2]);
                acc = ws_emu_ftz(acc + p1);
            }
            memcpy(&g_ws_emu.t[c][m][4 * n], &acc, 4);
        }
}

static void ws_emu_release() {
    memset(&g_ws_emu, 0, sizeof g_ws_emu);
}
