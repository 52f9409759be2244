#!/bin/bash
# Thirty-first session, call 3: a layer whose CPU side reads C blocks and T blocks in place now
# runs one kernel call over both pools (WRITESCOPE_CPU_PAIR_CALLS, default on) instead of two
# queued calls and a merge job. Call 2's DeepSeek-V2-Lite 4 x 128K writescope row attended
# 68.6 GB/s of KV on the CPU against static's 89.4 (C blocks only, one call a layer). The GPU
# tests of the hybrid step and the engine, then that row (writescope and static, experts on the
# GPU) with the paired call off and on.
source bench/results/run-helper.sh
call_begin 290
run gpu-tests-hybrid 110 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_hybrid.py tests/test_gpu_e2e.py tests/test_engine.py
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,static --context-lengths 128k --vram-budget 38GiB --batch 4"
run dsv2-pair0 80 env WRITESCOPE_CPU_PAIR_CALLS=0 python -m writescope bench --model deepseek-v2-lite $G --out $R/dsv2-pair0
run dsv2-pair1 80 python -m writescope bench --model deepseek-v2-lite $G --out $R/dsv2-pair1
call_end
