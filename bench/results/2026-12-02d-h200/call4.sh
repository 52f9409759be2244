#!/bin/bash
# Nineteenth session, call 4 (the same tree as call 3): issue 6's Qwen3-30B-A3B 4x128K with the
# experts on the CPU (the sixteenth session's call 4 command at 128K alone), then a second
# sample of issue 8's table and issue 9's MLA hybrid on the session's final kernel.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 45
run qwen3-cpu 300 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
