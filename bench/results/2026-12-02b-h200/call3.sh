#!/bin/bash
# Seventeenth session, call 3: the session's last kernel code (the AVX-512 BF16 variant's Q.K
# reduced 32 scores at a time into token-major scores, its vertical softmax, its prefetch spread
# over Q.K and P.V; exp2_fast shared with the AMX kernel). The GPU tests, and the CPU attention
# bench with every variant this CPU runs (AMX, the new AVX-512 BF16, AVX-512, AVX2), the torch
# path once.
source bench/results/run-helper.sh
call_begin 400
gpu_tests 170
run cpu-attn 200 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
call_end
