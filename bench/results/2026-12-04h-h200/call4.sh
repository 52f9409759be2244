# 2026-12-04h call 4: the final tree's GPU tests of the files changed after call 3 (the link's
# fallback guard, the benchmarks' shared timing loop).
source bench/results/run-helper.sh
call_begin 300
run link-tests 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_expert_link.py \
  tests/test_cpu_experts.py tests/test_bench.py
call_end
