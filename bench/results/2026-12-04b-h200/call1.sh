#!/bin/bash
# Thirty-seventh session, call 1: early reads before the dependent launches' waits (the merge's
# self terms and rows, the partials' chunk bounds, the router's weights, the down kernel's expert
# ids and first weight tile) -- their GPU tests, the 32K decode steps with them on and off
# (step_profile, which now lists the compiled kernels' registers, spills and shared memory);
# then the routed experts' launch settings swept (bench.gpu_experts) at Qwen3-30B-A3B's 2 and
# DeepSeek-V2-Lite's 4 tokens.
source bench/results/run-helper.sh
call_begin 560
run gpu-tests-sub 120 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_pdl.py tests/test_moe_triton.py \
  tests/test_router_logits.py tests/test_resident_merge.py tests/test_resident_write.py tests/test_selfmerge.py \
  tests/test_graphs.py tests/test_gpu_attention.py -k "not spilled and not hybrid"
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run q2-32k-late 45 env WRITESCOPE_PDL_EARLY=0 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-late.json
run d4-32k 45 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run d4-32k-late 45 env WRITESCOPE_PDL_EARLY=0 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-late.json
run q2-32k-b 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-b.json
run experts-q 120 python -m writescope.bench.gpu_experts --sweep --models qwen3-30b-a3b --tokens 2 --no-torch --reps 5 --json $R/experts-q.json
run experts-d 110 python -m writescope.bench.gpu_experts --sweep --models deepseek-v2-lite --tokens 4 --no-torch --reps 5 --json $R/experts-d.json
call_end
