# 2026-12-04i call 4: the GPU test suite on the session's package (graphed CPU expert calls by
# default in resident steps, WRITESCOPE_CPU_EXPERTS_GRAPHED=auto; the expert timeline).
source bench/results/run-helper.sh
call_begin 420
gpu_tests 400
grep -E "passed|failed" $R/gpu-tests.log | tail -3
call_end
