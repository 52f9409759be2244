#!/bin/bash
# The sixty-fourth session's two open questions in one call, most important first, each an A/B
# on one host:
# 1. block-completing resident steps where they matter: prompts whose lengths are spread over a
#    KV block (`--length-spread 64`), so that the sequences complete their blocks on different
#    steps, as a server's do. Qwen3-30B-A3B FP8 kv auto (`bench_row`) at batch 4 and 16 x 8K,
#    the default against WRITESCOPE_G_BLOCKS_ON_DEVICE=0 (such steps eager and synchronous);
# 2. waiting for an overlapped step's tokens sleeping (the default since 2bf2056) against
#    WRITESCOPE_BLOCKING_SYNC=0 (every host wait spins), on Qwen3 FP8 4 x 8K kv auto and
#    DeepSeek-V2-Lite bf16 4 x 32K kv auto;
# 3. the spread pair again in the other order, where time is left.
# Replaces pending/call2-wait-ab.sh and call3-spread.sh for a session with little device time.
# Carry .whl. CALL_S=540 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
spread() {
  WRITESCOPE_G_BLOCKS_ON_DEVICE=$2 bench_row s-$1 90 qwen3-30b-a3b 8k --config-override "$Q" \
    --batch 4,16 --length-spread 64
}
spread on-1 1; spread off-1 0
WRITESCOPE_BLOCKING_SYNC=1 bench_row q-sleep 60 qwen3-30b-a3b 8k --config-override "$Q"
WRITESCOPE_BLOCKING_SYNC=0 bench_row q-spin 60 qwen3-30b-a3b 8k --config-override "$Q"
WRITESCOPE_BLOCKING_SYNC=1 bench_row ds-sleep 70 deepseek-v2-lite 32k
WRITESCOPE_BLOCKING_SYNC=0 bench_row ds-spin 70 deepseek-v2-lite 32k
spread off-2 0; spread on-2 1
row_summary s-on-1 s-off-1 q-sleep q-spin ds-sleep ds-spin s-off-2 s-on-2
call_end
