#!/bin/bash
# Nineteenth session, call 3, on the session's final kernel (1aa76ca: the token-major Q.K's L1
# prefetch on, the byte shuffles dropped): the CPU attention tests on the real AMX unit, the
# GPU tests, issue 8's table, and issue 6's DeepSeek-V2-Lite 4x128K with the experts on the GPU
# (the eighteenth session's call 4 command) with a fresh calibration.
source bench/results/run-helper.sh
call_begin 560
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
gpu_tests 150
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
calibrate_profile 45
run dsv2-gpu-experts 200 env WRITESCOPE_STACKS_EVERY_S=190 python -m writescope bench \
  --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,transfer,cpu --out $R/dsv2-gpu-experts
call_end
