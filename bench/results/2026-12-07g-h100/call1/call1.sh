#!/bin/bash
# One call for a session whose device time allows one (the eightieth: three refused starts): the
# GPU tests of the modules whose GPU code changed since the last whole run (the staging ring's
# equal pieces, the CPU experts' result read in place, step_profile's chain and link figures,
# and the end-to-end parity of staged steps), then issue 6's CPU-experts 4 x 128K step under
# step_profile's CPU chain and link figures: the defaults (equal pieces), the next step's first
# units staged during this step's last layers (WRITESCOPE_STAGING_AHEAD=1), and the pieces as
# before (WRITESCOPE_STAGING_EQUAL_PIECES=0), as far as the time allows. CALL_S=560; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 190 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_gpu_attention.py \
  tests/test_cpu_experts.py tests/test_bench.py tests/test_pipelined_experts.py tests/test_gpu_e2e.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
calibrate_profile 45
chain chain-equal 100
chain chain-ahead 100 WRITESCOPE_STAGING_AHEAD=1
chain chain-unequal 100 WRITESCOPE_STAGING_EQUAL_PIECES=0
call_end
