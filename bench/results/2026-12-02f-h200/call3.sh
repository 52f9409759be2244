#!/bin/bash
# Twenty-first session, call 3: the GPU tests on the tree with one copy stream again; issue 6's
# DeepSeek-V2-Lite 4 x 128K row (experts on the GPU) with the CPU attention on all 16 cores
# against the engine's default 14, writescope and transfer each; issue 9's whole table once more.
source bench/results/run-helper.sh
call_begin 500
gpu_tests 160
calibrate_profile 45
DS="python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --prefill synthetic \
  --no-progress --rounds 2"
run dsv2-t16 110 $DS --cpu-threads 16 --policies writescope,transfer --out $R/dsv2-t16
run dsv2-t14 80 $DS --policies writescope --out $R/dsv2-t14
run gpu-attn 90 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --reps 2 \
  --cpu-threads 16 --shares 0,0.55,0.575,0.6,0.625,0.65,1 --skip resident --json $R/gpu_attention.json
call_end
