#!/bin/bash
# --kv-cache-memory against --experts auto's own split (fifty-sixth session): Qwen3-30B-A3B's FP8
# release (random weights, the FP8 config) and bf16 under 32 GiB, batch 4, writescope. For each
# row the value is the one `writescope plan --experts auto` gives with this call's calibration
# (its "expert_splits"), so the rows test the model's choice, not a hand-picked one. The model
# predicts (fifty-fifth session's calibration) FP8 4 x 32K 2.3x, bf16 4 x 8K 1.06x over the split
# auto makes for the row's own max_model_len. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
row() {  # NAME CAP CONTEXT KV_OPTION [bench args...]
  local name=$1 cap=$2 ctx=$3 kv=$4; shift 4
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto $kv "$@" --out $R/$name
}
best() {  # CONTEXT [plan args...]: the plan's engine option for that length
  local ctx=$1; shift
  python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 \
    --context-lengths $ctx --experts auto --json $R/plan-$ctx.json "$@" > /dev/null 2>&1
  python - $R/plan-$ctx.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["expert_splits"][0]
if r["best_cpu_layers"] == r["moe_layers"]:
    print("--experts cpu")
elif r["kv_cache_memory"] and r["best_cpu_layers"] != r["cpu_layers"]:
    print(f"--kv-cache-memory {r['kv_cache_memory'] // 2**20}MiB")
PY
}
for ctx in 32k 8k; do
  O=$(best $ctx --config-override "$Q"); echo "fp8 $ctx: ${O:-the planned split}" | tee -a $R/options.txt
  row fp8-$ctx-auto 110 $ctx "" --config-override "$Q"
  [ -n "$O" ] && row fp8-$ctx-best 110 $ctx "$O" --config-override "$Q"
done
O=$(best 8k); echo "bf16 8k: ${O:-the planned split}" | tee -a $R/options.txt
row bf16-8k-auto 80 8k ""
[ -n "$O" ] && row bf16-8k-best 80 8k "$O"
grep -h "tok/s" $R/*.log
call_end
