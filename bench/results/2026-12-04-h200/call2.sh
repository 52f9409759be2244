#!/bin/bash
# Thirty-sixth session, call 2: the decode chain's Triton kernels launched dependent on the
# kernel before (programmatic dependent launch, attention/launch.py pdl_args): its GPU test, the
# 32K steps of the three models with it and (WRITESCOPE_PDL=0) without it, A/B/A; issue 6's
# experts-on-GPU 32K rows of Qwen3 and DeepSeek; the full GPU suite.
source bench/results/run-helper.sh
call_begin 470
run pdl-test 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_pdl.py
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run q2-32k-nopdl 30 env WRITESCOPE_PDL=0 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-nopdl.json
run d4-32k 30 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run d4-32k-nopdl 30 env WRITESCOPE_PDL=0 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-nopdl.json
run q2-32k-b 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-b.json
run m2-32k 30 $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k 55 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k
run dsv2-32k 40 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-32k
gpu_tests 200
call_end
