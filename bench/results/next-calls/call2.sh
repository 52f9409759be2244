#!/bin/bash
# Next session, call 2: issue 6's "one run per model with experts on the GPU and a KV budget of
# 8 GB in HBM" at long contexts, all five policies, synthetic prefill: DeepSeek-V2-Lite (38 GiB:
# ~31 GB of weights, ~8 GB of KV = ~270K tokens) at 4 and 16 x 32K and 4 x 128K (4 x 32K fits G;
# 16 x 128K is over the host budgets: a failed row), Qwen3-30B-A3B (80 GiB: 8 GiB of KV, as in
# 2026-11-30e) at 2 x 32K and 2 x 128K. (Mixtral at 112 GiB: the same in a call of its own.)
source bench/results/run-helper.sh
call_begin 570
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
C="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run dsv2-gpu-experts 230 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB \
  --batch 4,16 --context-lengths 32k,128k $C --out $R/dsv2-gpu-experts
run qwen3-gpu-experts 290 python -m writescope bench --model qwen3-30b-a3b --vram-budget 80GiB \
  --batch 2 --context-lengths 32k,128k $C --out $R/qwen3-gpu-experts
call_end
