#!/bin/bash
# A short call (the eightieth session's last 247 s of device time): the CPU experts' in-place
# result test (fixed: its 24-layer chain overflowed to NaN) and the result-path bench -- does a
# small host-to-device result copy on the compute stream wait behind the staging ring's
# 138-268 MB pieces, and does reading it in place avoid that? CALL_S=90; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-90}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
run result-path 30 python -m writescope.bench.result_path --busy-mb 138,268 --reps 40 \
  --json $R/result_path.json
cat $R/result-path.log | grep "link busy"
run gpu-tests 45 python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf \
  "tests/test_cpu_experts.py::test_results_read_in_place_stay_theirs_while_the_launcher_runs_ahead" \
  "tests/test_bench.py::test_result_path_times_both_ways_alone_and_beside_a_busy_link"
call_end
