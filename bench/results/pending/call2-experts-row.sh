#!/bin/bash
# A shorter call than call1-suite-row.sh (written in the eighty-first session for the ~500 s it
# had left, and not run: no machine started): the GPU tests of the modules that build CPU expert
# calls on CUDA, now that their result is read in place by default
# (WRITESCOPE_CPU_EXPERT_RESULT=kernel), then issue 6's CPU-experts Qwen3-30B-A3B 4 x 128K row
# (writescope and static; the seventy-eighth's 0.850 and 0.841 of the bound) under the defaults.
# CALL_S=340; carry .whl (call1-suite-row.sh says how to rebuild it).
source bench/results/run-helper.sh
call_begin ${CALL_S:-340}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
run gpu-tests-experts 150 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest \
  -m gpu -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_cpu_experts.py \
  tests/test_pipelined_experts.py tests/test_gpu_e2e.py
grep -E "passed|failed|^FAILED" $R/gpu-tests-experts.log | tail -6
calibrate_profile 35
cpu_grid qwen3-cpu 140 qwen3-30b-a3b 4 128k --policies writescope,static
row_summary qwen3-cpu
call_end
