#!/bin/bash
# Next session, call 4: issue 6's "one run per model with experts on the GPU and a KV budget of
# 8 GB in HBM" at long contexts, all five policies, synthetic prefill: DeepSeek-V2-Lite (40 GiB:
# ~31 GB of weights) at 4 x 32K and 4 x 128K, Qwen3-30B-A3B (80 GiB, as in 2026-11-30e) at
# 2 x 32K and 2 x 128K. (Mixtral at 112 GiB: the same command in a call of its own.)
source bench/results/run-helper.sh
call_begin 570
C="--random-weights --profile bench/profiles/h200.json --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run dsv2-gpu-experts 230 python -m writescope bench --model deepseek-v2-lite --vram-budget 40GiB \
  --batch 4 --context-lengths 32k,128k $C --out $R/dsv2-gpu-experts
run qwen3-gpu-experts 330 python -m writescope bench --model qwen3-30b-a3b --vram-budget 80GiB \
  --batch 2 --context-lengths 32k,128k $C --out $R/qwen3-gpu-experts
call_end
