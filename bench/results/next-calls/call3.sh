#!/bin/bash
# Next session, call 3: Mixtral-8x7B 2 x 128K with experts on the CPU, writescope and migrate
# (migrate was cut off by its cap in the ninth session); the step profile of a 4 x 32K
# DeepSeek-V2-Lite step after the tenth session's launch and copy changes (54 of 65 ms was host
# time before; 46 of 54 after), plain and pipelined.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
run mixtral 300 python -m writescope bench --model mixtral-8x7b --vram-budget 32GiB --experts cpu \
  --batch 2 --context-lengths 128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress \
  --policies writescope,migrate --out $R/mixtral
SP="python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights --batch 4 --prefill synthetic --experts gpu --warmup 4 --steps 2 --cprofile 4 --top 40 --profile $P --context 32768 --vram-budget 48GiB --num-gpu-blocks 128"
run prof32-plain 60 $SP --json $R/step_profile_32k_plain.json
run prof32-pipe 60 env WRITESCOPE_PIPELINE=1 $SP --json $R/step_profile_32k_pipe.json
call_end
