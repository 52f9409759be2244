#!/bin/bash
# Next session, call 3: the transformers peer at 8K and 32K (DeepSeek-V2-Lite, experts on the
# CPU, 32 GiB, the peer's weights offloaded past 60% of the budget; the ninth session measured
# 35.7x at 8K, with greedy tokens that differ from the first one: peer rows now carry
# first_divergence, the peer's log-probability gap where the tokens part); then DeepSeek-V2-Lite 4 x 32K with experts on the GPU, plain and
# pipelined, after the host time per attention call has been cut.
source bench/results/run-helper.sh
call_begin 570
run peer 300 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k,32k --decode-steps 8 --policies writescope --peer transformers \
  --peer-offload-weights --no-progress --out $R/peer
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 24 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --prefill synthetic --warmup-length 4k --no-progress"
run dsv2-plain 100 $B --policies writescope,transfer --out $R/dsv2-plain
run dsv2-pipe 80 env WRITESCOPE_PIPELINE=1 $B --policies writescope --out $R/dsv2-pipe
call_end
