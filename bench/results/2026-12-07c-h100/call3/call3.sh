#!/bin/bash
# Seventy-fifth session, call 3, on the session's tree after beam search, the chat's context shift and three QA merges
# (tests/test_gpu_e2e.py gains beam search on CUDA).
# 1. The whole GPU suite (cap 420 s).
# 2. Issue 8's table on this host (cap 110 s).
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
run cpu-attn 110 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
tail -12 $R/cpu-attn.log
call_end
