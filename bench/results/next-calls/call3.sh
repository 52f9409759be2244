#!/bin/bash
# Next session, call 3: the transformers peer at 8K and 32K (DeepSeek-V2-Lite, experts on the
# CPU, 32 GiB, the peer's weights offloaded past 60% of the budget; the ninth session measured
# 35.7x at 8K, with greedy tokens that differ from the first one: peer rows now carry
# first_divergence, the peer's log-probability gap where the tokens part); then where the
# host time of an attention call goes (DeepSeek-V2-Lite 4 x 32K, experts on the GPU,
# step_profile, plain and pipelined).
source bench/results/run-helper.sh
call_begin 570
run peer 240 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k,32k --decode-steps 8 --policies writescope --peer transformers \
  --peer-offload-weights --no-progress --out $R/peer
# where the host time of an attention call goes, plain and pipelined (the ninth session: 24 ms of
# a 49 ms step in attention calls, 45 ms pipelined, ~0.8 ms a call)
SP="python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights --batch 4 --context 32768 --prefill synthetic --experts gpu --vram-budget 48GiB --num-gpu-blocks 128 --warmup 4 --steps 2 --profile bench/profiles/h200.json"
run profile-plain 90 $SP --json $R/step_profile_plain.json
run profile-pipe 90 env WRITESCOPE_PIPELINE=1 $SP --json $R/step_profile_pipe.json
call_end
