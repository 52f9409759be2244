// The AVX-512 BF16 kernel (attn_bf16.cpp) with its software prefetch into L2 (PREFETCHT1)
// instead of L1: kernel variant "avx512bf16-l2" (isa code 4). Which level is faster depends on
// the core: on the 2-core Zen 4 dev VM this one read GQA and MLA KV from DRAM 1.20-1.33x as
// fast (bench.cpu_ab, two threads, two runs of 9 paired calls a shape, 2026-12-04); on the
// Zen 5 VM the L1 form was 1.0-1.11x the L2 one (seventeenth session). `writescope calibrate`
// times both and the profile keeps the faster per attention family.
#define WS_BF16_PF_HINT _MM_HINT_T1
#define WS_BF16_ITEM_FN ws_item_avx512bf16_l2
#include "attn_bf16.cpp"
