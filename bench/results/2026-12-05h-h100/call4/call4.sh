#!/bin/bash
# The fit's second form and the 64K rows (fifty-seventh session). `--experts auto` alone now
# also keeps one max_model_len sequence's KV once the activations are measured (call 2 of the
# session showed its FP8 4 x 8K row with G 54 blocks, less than one 8K sequence's 128). Then
# `--kv-cache-memory auto` against `--experts auto` at 4 x 64K, where the plan with call 2's
# calibration predicts 1.86x (FP8, 42 of 48 layers' experts on the CPU) and 1.63x (bf16, 45 of
# 48). Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-400}
run gpu-move 120 python -m pytest -m gpu -v -p no:cacheprovider --tb=short -rf tests/test_expert_move.py
grep -E "passed|failed|^FAILED" $R/gpu-move.log | tail -4
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
row() {  # NAME CAP CONTEXT [bench args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto "$@" --out $R/$name
}
row fp8-8k-auto 60 8k --config-override "$Q"
for ctx in 64k; do
  python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 \
    --context-lengths $ctx --experts auto --config-override "$Q" --json $R/plan-fp8-$ctx.json \
    | tail -4 | tee -a $R/plans.txt
  row fp8-$ctx-kvauto 120 $ctx --config-override "$Q" --kv-cache-memory auto
  row fp8-$ctx-auto 120 $ctx --config-override "$Q"
done
grep -h "built in\|tok/s" $R/*.log
call_end
