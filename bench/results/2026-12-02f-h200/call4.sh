#!/bin/bash
# Twenty-first session, call 4 (the last device seconds): issue 9's spilled table twice (both
# shapes in one run, one combined ceiling each), issue 8's table between them; issue 6's
# DeepSeek-V2-Lite 4 x 128K row (experts on the GPU) with plain and pipelined
# (WRITESCOPE_PIPELINE=1) writescope steps.
source bench/results/run-helper.sh
call_begin 380
HY="python -m writescope.bench.gpu_attention --reps 2 --cpu-threads 16 --shares 0,0.55,0.575,0.6,0.625,0.65,1 --skip resident"
run gpu-attn-a 70 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 $HY --json $R/gpu_attention-a.json
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
run gpu-attn-b 70 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 $HY --json $R/gpu_attention-b.json
calibrate_profile 30
DS="python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --prefill synthetic \
  --no-progress --rounds 2"
run dsv2 90 $DS --policies writescope,transfer --out $R/dsv2
run dsv2-pipe 60 env WRITESCOPE_PIPELINE=1 $DS --policies writescope --out $R/dsv2-pipe
call_end
