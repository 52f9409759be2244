#!/bin/bash
# Thirtieth session, call 2: resident steps cut into several graphs (engine/graphs.py
# WRITESCOPE_GRAPH_SEGMENT_LAYERS: the device starts on the first graph while the host launches
# the next; a whole-step graph's launch took 3.5-5.5 ms of host time before any work started).
# The GPU tests of engine/graphs.py, then step_profile A/B: DeepSeek-V2-Lite 4 x 32K and Qwen3
# 2 x 32K experts on the GPU (resident, one graph by default), Qwen3 1 x 1K with graphed CPU
# expert calls; each at 0 (one graph) and a few cuts, alternating.
source bench/results/run-helper.sh
call_begin 420
run gpu-tests-graphs 110 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_graphs.py
P=bench/profiles/h200.json
A="--top 30 --steps 8 --warmup 3 --cprofile 0"
ds() { run ds4-32k-seg$1 45 env WRITESCOPE_GRAPH_SEGMENT_LAYERS=$1 python -m writescope.bench.step_profile \
  --model deepseek-v2-lite --random-weights --profile $P --prefill synthetic --batch 4 --context 32k \
  --experts gpu --vram-budget 38GiB $A --json $R/ds4-32k-seg$1.json; }
ds 0; ds 3; ds 1; ds 9
export WRITESCOPE_GRAPH_SEGMENT_LAYERS=0; host_profile q2-32k-seg0 45 2 32k gpu 68GiB $A
export WRITESCOPE_GRAPH_SEGMENT_LAYERS=4; host_profile q2-32k-seg4 45 2 32k gpu 68GiB $A
export WRITESCOPE_CPU_EXPERTS_GRAPHED=1
export WRITESCOPE_GRAPH_SEGMENT_LAYERS=0; host_profile q1-graphed-seg0 45 1 1k cpu 32GiB $A
export WRITESCOPE_GRAPH_SEGMENT_LAYERS=4; host_profile q1-graphed-seg4 45 1 1k cpu 32GiB $A
unset WRITESCOPE_CPU_EXPERTS_GRAPHED WRITESCOPE_GRAPH_SEGMENT_LAYERS
call_end
