#!/bin/bash
# Seventy-eighth session, call 1: issue 6's experts-on-CPU five-policy row on the current code
# (last run in the thirty-ninth session, 2026-12-04d-h200/call2: writescope 338.2 ms, 1.43x
# transfer, 1.60x cpu, 1.027x static, 1.007x migrate, 0.840 of its bound) -- the one
# configuration whose spilled KV per step exceeds the activated experts' bytes -- and issue 8's
# table on the same host. Carry .whl. CALL_S=540 (timeout 570).
source bench/results/run-helper.sh
call_begin ${CALL_S:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" > $R/lscpu.txt
calibrate_profile 50
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
cpu_grid qwen3-cpu 330 qwen3-30b-a3b 4 128k
row_summary qwen3-cpu
call_end
