#!/bin/bash
# Seventy-first session, call 1, on the tree after the QA fixes to the config, engine and CLI
# (max_model_len defaults to vLLM's derived length, capped by the KV budgets and a sliding window).
# 1. The whole GPU suite (cap 400 s).
# 2. Where a spilled eager step's host time goes on the current code: the fifty-sixth session's
#    step_profile --cprofile row (Qwen3-30B-A3B 4 x 8K, experts on the GPU, 128 GPU blocks,
#    bench/results/2026-12-05g-h100/call3), against the committed H200 profile.
# 3. Issue 8's table on this host.
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
P=bench/profiles/h200.json
host_profile q4-8k-spill 100 4 8k gpu 68GiB --num-gpu-blocks 128 --warmup 3 --steps 3
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
tail -12 $R/cpu-attn.log
call_end
