// The AMX tile operations as attn_amx.cpp (and bench/microbench/amx_mla_layout.cpp) use them:
// the instructions themselves, or with -DWS_AMX_EMULATE (tests only) the portable emulation in
// attn_amx_emu.h.
#pragma once
#include <immintrin.h>

#ifdef WS_AMX_EMULATE
#include "attn_amx_emu.h"
#define T_CFG(p) ws_emu_loadconfig(p)
#define T_LOAD(t, p, s) ws_emu_loadd(t, p, s)
#define T_STORE(t, p, s) ws_emu_stored(t, p, s)
#define T_ZERO(t) ws_emu_zero(t)
#define T_DP(c, a, b) ws_emu_dpbf16ps(c, a, b)
#define T_RELEASE() ws_emu_release()
#else
#define T_CFG(p) _tile_loadconfig(p)
#define T_LOAD(t, p, s) _tile_loadd(t, p, s)
#define T_STORE(t, p, s) do { _tile_stored(t, p, s); T_FENCE(); } while (0)
#define T_ZERO(t) _tile_zero(t)
#define T_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define T_RELEASE() _tile_release()
#endif
// GCC's _tile_loadd / _tile_loadconfig asm declares no memory input beyond the pointer (or 8
// bytes): a compiler barrier after vector stores whose data a tile load (or LDTILECFG) reads
// (GCC 12 deletes a config's stores without it, and LDTILECFG faults), and after every tile
// store (its asm declares no memory output: later vector reads could be hoisted above it).
#define T_FENCE() __asm__ volatile("" ::: "memory")
