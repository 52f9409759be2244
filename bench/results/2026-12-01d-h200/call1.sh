#!/bin/bash
# 2026-12-01, tenth session, call 1: GPU tests of HEAD (the ninth session's changes after dfc1c51
# were never GPU-tested); the hybrid bench with the engine's 14 CPU threads; where the host time
# of a decode step's attention calls goes (step_profile --cprofile), DeepSeek-V2-Lite with
# experts on the GPU at 4 x 32K and 4 x 128K, plain and pipelined.
source bench/results/run-helper.sh
call_begin 555
gpu_tests 130
calibrate_profile
run hybrid14 90 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 --reps 2 \
  --cpu-threads 14 --json $R/gpu_attention-hybrid14.json
SP="python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights --batch 4 --prefill synthetic --experts gpu --warmup 4 --steps 2 --cprofile 4 --top 40 --profile $P"
S32="--context 32768 --vram-budget 48GiB --num-gpu-blocks 128"
S128="--context 131072 --vram-budget 38GiB"
run prof32-plain 60 $SP $S32 --json $R/step_profile_32k_plain.json
run prof32-pipe 60 env WRITESCOPE_PIPELINE=1 $SP $S32 --json $R/step_profile_32k_pipe.json
run prof128-plain 75 $SP $S128 --json $R/step_profile_128k_plain.json
run prof128-pipe 75 env WRITESCOPE_PIPELINE=1 $SP $S128 --json $R/step_profile_128k_pipe.json
call_end
