#!/bin/bash
# Twenty-first session, call 2: issue 9's whole table in one run (resident, streamed, hybrid for
# both shapes, one combined ceiling) with the shares finer around the balance call 1 found
# (0.55-0.65), the copy streams back to one (two were slower, call 1); issue 8's table; a fresh
# calibration; issue 6's DeepSeek-V2-Lite 4 x 128K row with the experts on the GPU.
source bench/results/run-helper.sh
call_begin 470
run gpu-attn 120 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --reps 2 \
  --cpu-threads 16 --shares 0,0.55,0.575,0.6,0.625,0.65,1 --json $R/gpu_attention.json
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
calibrate_profile 45
run dsv2-gpu-experts 210 env WRITESCOPE_STACKS_EVERY_S=200 python -m writescope bench \
  --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,transfer,cpu --out $R/dsv2-gpu-experts
call_end
