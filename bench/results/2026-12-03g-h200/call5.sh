#!/bin/bash
# Thirty-second session, call 5: the planner's host time a step (region counts kept per block
# table tuple; one prediction for a step that timed no path). The GPU tests of the fused layers
# (the two rotation kernels are now one, a constexpr form flag), the self-merge, the graphs and
# the engine, then issue 6's DeepSeek-V2-Lite 4 x 32K row with the experts on the GPU (all KV in
# HBM; call 3: writescope 10.9 ms against 10.0-10.1 for the others, its host time 2.36 ms against
# 1.22-1.44), two rounds of alternating order (242 s of device time were left).
source bench/results/run-helper.sh
call_begin 115
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run gpu-tests-engine 70 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_fused_layers.py tests/test_selfmerge.py tests/test_graphs.py tests/test_engine.py
run dsv2-32k 40 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --rounds 2 --out $R/dsv2-32k
call_end
