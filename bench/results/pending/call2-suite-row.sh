#!/bin/bash
# The eighty-first session's second call: the whole GPU suite (the call before an issue touching
# GPU code is resolved; H100 hosts took 206-401 s, the H200 210-260 s), then issue 6's
# CPU-experts Qwen3-30B-A3B 4 x 128K row (writescope and static, the seventy-eighth's 0.850 and
# 0.841 of the bound) under the settings in $BEST (e.g. "WRITESCOPE_CPU_EXPERT_RESULT=kernel"),
# exported after the suite. CALL_S=560; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
calibrate_profile 45
echo "settings: ${BEST:-defaults}" | tee $R/settings.txt
[ -n "$BEST" ] && export $BEST
cpu_grid qwen3-cpu 150 qwen3-30b-a3b 4 128k --policies writescope,static
row_summary qwen3-cpu
call_end
