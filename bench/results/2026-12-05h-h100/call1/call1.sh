#!/bin/bash
# --kv-cache-memory auto against --experts auto's own split (fifty-sixth session): Qwen3-30B-A3B's
# FP8 release (random weights, the FP8 config) and bf16 under 32 GiB, batch 4, writescope. With
# `auto` the engine takes the split the roofline predicts fastest for the grid's largest batch of
# its longest context (planner/expert_split.py); each grid here is one row, so it is that row's.
# Predicted (fifty-fifth session's calibration): FP8 4 x 32K 2.3x, bf16 4 x 8K ~1.06x over the
# split auto makes for the row's own max_model_len. `writescope plan` with this call's
# calibration records what the model predicted here. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
row() {  # NAME CAP CONTEXT [bench args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto "$@" --out $R/$name
}
for ctx in 32k 8k; do
  python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 \
    --context-lengths $ctx --experts auto --config-override "$Q" --json $R/plan-fp8-$ctx.json \
    | tail -4 | tee -a $R/plans.txt
  row fp8-$ctx-auto 110 $ctx --config-override "$Q"
  row fp8-$ctx-kvauto 110 $ctx --config-override "$Q" --kv-cache-memory auto
done
row bf16-8k-auto 80 8k
row bf16-8k-kvauto 80 8k --kv-cache-memory auto
grep -h "built in\|tok/s" $R/*.log
call_end
