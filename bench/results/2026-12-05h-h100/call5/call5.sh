#!/bin/bash
# The session's last device seconds (fifty-seventh session): the GPU tests of the start-up fit
# and the engine's end-to-end GPU tests at the final tree, whose engine changes since the whole
# suite ran (3d02455, call 3) are the fit for experts='auto' alone, its num_gpu_blocks cap and
# the activation reserve in stats. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
run gpu-final 130 python -m pytest -m gpu -v -p no:cacheprovider --tb=short -rf \
  tests/test_expert_move.py tests/test_gpu_e2e.py
grep -E "PASSED|FAILED|passed|failed" $R/gpu-final.log | tail -12
call_end
