#!/bin/bash
# Thirty-second session, call 3: the GPU tests of the fused kernels again (call 2's self-merge test
# asked float32 for the torch form's bits; it now asks that of bf16 only), Mixtral-8x7B 2 x 32K's
# step with and without the fused kernels, then issue 6's experts-on-GPU rows at 32K (the
# thirtieth session's flags) for all three models with them, and one more DeepSeek-V2-Lite
# 4 x 128K writescope/transfer pair if time is left.
source bench/results/run-helper.sh
call_begin 440
run gpu-tests-fused 70 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_selfmerge.py tests/test_fused_layers.py
P=bench/profiles/h200.json
OFF="WRITESCOPE_FUSED_SELF_MERGE=0 WRITESCOPE_FUSED_ROUTER=0 WRITESCOPE_FUSED_ROPE=0 WRITESCOPE_FUSED_QKV=0"
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 3 --warmup 3 --cprofile 0"
run m2-32k-fused 40 $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k-fused.json
run m2-32k-torch 40 env $OFF $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k-torch.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k 70 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k
run dsv2-32k 70 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-32k
run mixtral-32k 90 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-32k
dsv2_row dsv2-128k 90 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
