#!/bin/bash
# Sixty-sixth session, call 1: the whole GPU suite on 3c5de6c (the sixty-fifth's final tree; its
# engine split, server/generation.py, bench CLI changes and hostmem cleanup never ran on the
# GPU), then issue 6's Qwen3-30B-A3B 1 x 1K batch-1 row twice (not re-run since the sixty-fourth).
# Carry .whl. CALL_S=585 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-585}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|Model:|^CPU\(s\)" | tee $R/cpu.txt
gpu_tests 430
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
calibrate_profile 30
batch1_row q-1 55 qwen3-30b-a3b 1k
batch1_row q-2 55 qwen3-30b-a3b 1k
row_summary q-1 q-2
call_end
