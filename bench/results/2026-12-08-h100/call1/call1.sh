#!/bin/bash
# The eighty-first session's first call: the GPU tests of the modules whose GPU code changed in
# the eightieth (its new and extended tests had not run on a device; the host's first process
# was slow in the eightieth, so they also warm the host), then issue 6's CPU-experts 4 x 128K
# step along its CPU chain (the chain helper) with the experts' result copied (the default) and
# read in place (WRITESCOPE_CPU_EXPERT_RESULT=kernel; call2-chain.sh says why), the result-path
# bench, and the in-place result with the next step's first units staged ahead and each
# sequence's CPU-read T blocks held through small moves of the share (WRITESCOPE_SHARE_HOLD:
# a moved share remakes the staging plan, which drops the units staged ahead).
# CALL_S=560; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
run gpu-tests-changed 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest \
  -m gpu -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_gpu_attention.py \
  tests/test_cpu_experts.py tests/test_bench.py tests/test_pipelined_experts.py tests/test_gpu_e2e.py \
  tests/test_hybrid.py
grep -E "passed|failed|^FAILED" $R/gpu-tests-changed.log | tail -6
calibrate_profile 45
chain chain-equal 95
chain chain-result-kernel 95 WRITESCOPE_CPU_EXPERT_RESULT=kernel
run result-path 40 python -m writescope.bench.result_path --busy-mb 138,268 --reps 40 \
  --json $R/result_path.json
grep "link busy" $R/result-path.log
chain chain-kernel-ahead-hold 95 WRITESCOPE_CPU_EXPERT_RESULT=kernel WRITESCOPE_STAGING_AHEAD=1 \
  WRITESCOPE_SHARE_HOLD=0.01
call_end
