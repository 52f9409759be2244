// Shared declarations of the CPU decode-attention kernel (writescope/attention/cpu.py).
//
// Plain C structs only: the ISA translation units (attn_avx2.cpp, attn_avx512.cpp, attn_amx.cpp)
// are compiled for different instruction sets, so nothing inline may be shared between them
// (an inline function instantiated with AVX-512 code could be picked by the linker for the AVX2
// caller). Each ISA unit keeps its code in an anonymous namespace and exports one function.
#pragma once
#include <stdint.h>

// One layer of one pool.
//   layout 0 (C region):  [N, H, bs/2, R, 2]  -- token pairs interleaved ("VNNI pairs"):
//                          element (t, d) of head h of block b is at
//                          b*block_stride + h*bs*R + ((t>>1)*R + d)*2 + (t&1)
//   layout 1 (T/G region): [N, bs, H, R]     -- element at b*block_stride + (t*H + h)*R + d
struct WsArgs {
    const void* kv;
    int dtype;   // 0: float32, 1: bfloat16
    int layout;  // 0: cpu, 1: gpu
    int64_t block_stride;  // elements between consecutive blocks
    int H, bs, R, k_off, Dk, v_off, Dv;
    float qs;  // the factor the items' queries carry (scale * log2(e)); the AMX path divides it
               // out before rounding q to bf16 and applies it to the fp32 scores instead
};

// One unit of work: M query vectors (query rows x heads of one KV group) of one sequence over
// a run of that sequence's blocks, for one KV head.
struct WsItem {
    const float* q;  // [M][Dk], already multiplied by scale * log2(e)
    int M, head;
    const int32_t* blocks;
    const int32_t* lens;
    int nblocks;
    float* o;  // [M][Dv] out: un-normalised sum of 2^(s - m) v
    float* m;  // [M] out: running max of s (base-2 units)
    float* l;  // [M] out: sum of 2^(s - m)
};

// Blocks of a call's first pool that several of its sequences list (prefix caching: one
// document, many questions), in sets by holders: read once for all of a set's holders, whose
// own lists (the call's kv_indptr / kv_blocks) leave them out. Set k's holders are
// set_seqs[set_indptr[k] .. set_indptr[k + 1]) (sequence indices), its blocks
// kv_blocks[kv_indptr[k] .. kv_indptr[k + 1]) with kv_lens valid tokens each.
struct WsShared {
    int32_t nsets;
    const int32_t* set_indptr;
    const int32_t* set_seqs;
    const int32_t* kv_indptr;
    const int32_t* kv_blocks;
    const int32_t* kv_lens;
};

typedef void (*ws_item_fn)(const WsArgs*, const WsItem*);

void ws_item_avx2(const WsArgs*, const WsItem*);
void ws_item_avx512(const WsArgs*, const WsItem*);
void ws_item_amx(const WsArgs*, const WsItem*);
void ws_item_avx512bf16(const WsArgs*, const WsItem*);
void ws_item_avx512bf16_l2(const WsArgs*, const WsItem*);  // the same, prefetching into L2
// 1 when the AVX512-BF16 path takes this shape (bf16, K/V dims and offsets % 16 == 0)
int ws_bf16_eligible(const WsArgs*);
// 1 when the AMX unit accepts this shape (bf16, Dk and Dv % 16 == 0, bs % 32 == 0 in the C
// layout, bs % 16 == 0 in the GPU layout)
int ws_amx_eligible(const WsArgs*);
// How many blocks ahead of the blocks being read the AMX kernel's software prefetch may run
// (0: none -- the hardware prefetchers alone; attn_ops.cpp holds it, ws_set_prefetch_blocks
// sets it).
int ws_prefetch_blocks(void);
// One thread's part of the tile-load read probe (attn_amx.cpp): 1 KB tiles [t0, t1) of x through
// the tile unit, `ahead` tiles of software prefetch; returns a checksum. AMX machines only.
double ws_tile_stream(const void* x, int64_t t0, int64_t t1, int64_t ahead);
