#!/bin/bash
# The GPU test of experts moved to the CPU (tests/test_expert_move.py), with its reserve measured
# again as the fifty-seventh session's calls 2, 4 and 5 did: call 4 of this session ran the form
# that reads the probe engine's own first measurement, and its bf16 case moved nothing.
# Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-120}
run gpu-move 100 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf tests/test_expert_move.py
grep -E "passed|failed|^FAILED" $R/gpu-move.log | tail -4
call_end
