#!/bin/bash
# Thirtieth session, call 4 (the session's last ~290 s of device time): are resident steps
# with eager CPU expert calls right now that each capture's warm-up runs on the eager step's
# inputs (they diverged in the twenty-eighth session)? The GPU test with
# WRITESCOPE_RESIDENT_ATTENTION=force, then the Qwen3 1 x 1K CPU-experts step with it and without.
source bench/results/run-helper.sh
call_begin 165
run gpu-test-resident-eager-experts 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=50 tests/test_graphs.py -k around_eager_cpu_expert
P=bench/profiles/h200.json
A="--top 30 --steps 6 --warmup 3 --cprofile 0"
export WRITESCOPE_RESIDENT_ATTENTION=force; host_profile q1-resident 45 1 1k cpu 32GiB $A; unset WRITESCOPE_RESIDENT_ATTENTION
host_profile q1-default 45 1 1k cpu 32GiB $A
call_end
