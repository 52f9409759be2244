#!/bin/bash
# Sixty-third session, after call 4 (the whole suite: only the new lifetime test failed, each
# engine leaving 64-96 MiB of cuBLAS workspaces on per-capture streams): the GPU tests of the
# engine's lifetime, the CUDA graphs and the split expert steps with the captures' warm-up on one
# stream per device. Carry .whl. CALL_S=200.
source bench/results/run-helper.sh
call_begin ${CALL_S:-200}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 170 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_engine_lifetime.py \
  tests/test_graphs.py tests/test_pipelined_experts.py
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu-tests.log | tail -12
call_end
