#!/bin/bash
# Decode steps with CPU experts in two sub-batches (WRITESCOPE_PIPELINE_EXPERTS) beyond the
# fifty-ninth session's Qwen3 FP8 rows (bench/results/2026-12-05j-h100), sixtieth session. Rows
# in priority order (later ones are skipped when the call's time runs out):
# 1. Qwen3-30B-A3B bf16 with every routed expert on the CPU (--experts cpu), 4 x 8K, all KV in
#    HBM: one batch, split and `auto`. The planner predicts the split slower there (the CPU's
#    experts are the whole step); `auto` should keep one batch.
# 2. `writescope bench` under the defaults (`auto`), Qwen3 FP8 4 x 8K --kv-cache-memory auto:
#    peak VRAM within the 32 GiB budget with the split step's per-group resident buffers, and
#    the step forms auto chose.
# 3. DeepSeek-V2-Lite bf16 4 x 32K --kv-cache-memory auto (6 of 26 layers' experts on the CPU):
#    one batch against split (plan: 18.3 against 15.2 ms with the fifty-ninth's call-2 profile).
# 4. Mixtral-8x7B FP8 4 x 8K --kv-cache-memory auto (16 of 32 layers): one batch against split.
# Carry .whl as in call1-full-suite.sh. CALL_S=560.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
prof() {  # NAME CAP MODEL CONTEXT [step_profile args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope.bench.step_profile --model $model --random-weights \
    --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context $ctx \
    --prefill synthetic --warmup 4 --steps 6 --top 10 "$@" --json $R/$name.json
}
WRITESCOPE_PIPELINE_EXPERTS=0 prof qcpu-8k-one 75 qwen3-30b-a3b 8k --experts cpu
WRITESCOPE_PIPELINE_EXPERTS=1 prof qcpu-8k-split 75 qwen3-30b-a3b 8k --experts cpu
WRITESCOPE_PIPELINE_EXPERTS=auto prof qcpu-8k-auto 80 qwen3-30b-a3b 8k --experts cpu --warmup 16
run bench-fp8-8k 110 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
  --prefill synthetic --no-progress --batch 4 --context-lengths 8k --policies writescope \
  --experts auto --kv-cache-memory auto --config-override "$Q" --out $R/bench-fp8-8k
WRITESCOPE_PIPELINE_EXPERTS=0 prof ds-32k-one 80 deepseek-v2-lite 32k --experts auto --kv-cache-memory auto
WRITESCOPE_PIPELINE_EXPERTS=1 prof ds-32k-split 80 deepseek-v2-lite 32k --experts auto --kv-cache-memory auto
WRITESCOPE_PIPELINE_EXPERTS=0 prof mx-fp8-8k-one 100 mixtral-8x7b 8k --experts auto --kv-cache-memory auto --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof mx-fp8-8k-split 100 mixtral-8x7b 8k --experts auto --kv-cache-memory auto --config-override "$Q"
for f in qcpu-8k-one qcpu-8k-split qcpu-8k-auto ds-32k-one ds-32k-split mx-fp8-8k-one mx-fp8-8k-split; do
  [ -f $R/$f.log ] && echo "$f: $(grep -h 'median of' $R/$f.log | cut -c1-330)"; done
grep -h "tok/s\|peak" $R/bench-fp8-8k.log | head -4
for a in "qwen3-30b-a3b 8k --experts cpu" "deepseek-v2-lite 32k --experts auto --kv-cache-memory auto"; do
  set -- $a; for pe in off on; do
    python -m writescope plan --model $1 --profile $P --vram-budget 32GiB --batch 4 --max-num-batched-tokens 16384 \
      --context-lengths $2 ${@:3} --pipeline-experts $pe 2>&1 | tail -6 >> $R/plans.txt; done; done
for pe in off on; do
  python -m writescope plan --model mixtral-8x7b --profile $P --vram-budget 32GiB --batch 4 --max-num-batched-tokens 16384 \
    --context-lengths 8k --experts auto --kv-cache-memory auto --config-override "$Q" --pipeline-experts $pe 2>&1 | tail -6 >> $R/plans.txt; done
call_end
