#!/bin/bash
# The GPU tests of every module that builds engines with routed experts on the CPU, on the tree
# that makes WRITESCOPE_PIPELINE_EXPERTS=auto the default (fifty-ninth session): with two or
# more sequences whose KV is all in HBM, their engines now probe the split form too. A smaller
# call than the whole suite (call1-full-suite.sh), whose starts were refused. Carry .whl as in
# call1-full-suite.sh. CALL_S=330, timeout 380.
source bench/results/run-helper.sh
call_begin ${CALL_S:-330}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 300 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_graphs.py \
  tests/test_pipelined_experts.py tests/test_gpu_e2e.py tests/test_expert_move.py \
  tests/test_kv_cache_memory.py tests/test_expert_link.py tests/test_cpu_experts.py \
  tests/test_bench.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -8
call_end
