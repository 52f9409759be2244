#!/bin/bash
# Seventy-second session, the last short call (ten starts refused left 434 s of device time):
# the attention launches' Python a call on this host (bench.launch_host), then the GPU tests of
# the modules this session's launch changes touch (bound partials, merge and flag-wait
# launches, launch flags and pinned views read once per step): the GPU attention kernels and
# the hybrid step, dependent launches, the merges, the end-to-end parity runs, with what the
# call has left. Carry .whl. CALL_S=270 (timeout 290).
source bench/results/run-helper.sh
call_begin ${CALL_S:-270}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run launch-host 25 python -m writescope.bench.launch_host --calls 6000 --json $R/launch_host.json
left=$((DEADLINE - $(date +%s) - 10))
run gpu-tests $left env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_gpu_attention.py \
  tests/test_pdl.py tests/test_selfmerge.py tests/test_resident_merge.py \
  tests/test_resident_write.py tests/test_gpu_e2e.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
call_end
