#!/bin/bash
# The sixty-fifth session's final tree: the whole GPU suite (the cpu_experts module split by job,
# the step plan out of cache.py), the host's time a decode step at batch 64 (the step plan's
# new home), then issue 6's DeepSeek-V2-Lite 1 x 8K batch-1 row (every expert on the CPU) with
# the native queue's thread spinning 200 us on each call's ready word before its 20 us naps
# (WRITESCOPE_CPU_EXPERT_SPIN_US=200) against the default (256 pauses, then naps), alternating.
# Carry .whl. CALL_S=560 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
run overhead-b64 60 python -m writescope.bench.policy_overhead --policies transfer,writescope \
  --batch 64 --prompt 1000 --steps 40 --json $R/overhead-b64.json
grep begin_step $R/overhead-b64.log
calibrate_profile 45
batch1_row d-nap-1 60 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0
batch1_row d-spin-1 60 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=200
batch1_row d-spin-2 60 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=200
batch1_row d-nap-2 60 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0
row_summary d-nap-1 d-spin-1 d-spin-2 d-nap-2
call_end
