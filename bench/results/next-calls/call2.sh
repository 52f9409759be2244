#!/bin/bash
# Next session, call 2: issue 6's experts-on-GPU run with ~8 GB of KV in HBM for Qwen3-30B-A3B
# (80 GiB) at 2 x 128K, and Mixtral-8x7B's migrate row with CPU experts (the ninth session's
# call 2 ended at its cap before it), plus Mixtral 2 x 128K writescope again beside it.
source bench/results/run-helper.sh
call_begin 570
calibrate_profile
C="--random-weights --profile $P --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run qwen3-gpu-experts 260 python -m writescope bench --model qwen3-30b-a3b --vram-budget 80GiB \
  --experts gpu --batch 2 --context-lengths 128k $C \
  --policies writescope,transfer,cpu,static,migrate --out $R/qwen3-gpu-experts
run mixtral 230 python -m writescope bench --model mixtral-8x7b --vram-budget 32GiB --experts cpu \
  --batch 2 --context-lengths 128k $C --policies writescope,migrate --out $R/mixtral
call_end
