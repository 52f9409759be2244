#!/bin/bash
# Sixtieth session, third call: not run (seven starts refused in that session; its device
# time ran out). For the next session, as it stands. The planner now times decode steps with CPU experts and all KV
# in HBM in the faster of one batch and two sub-batches (`roofline.Pipelined` "auto", the form
# WRITESCOPE_PIPELINE_EXPERTS's default gives them), and `kv_cache_memory="auto"` chooses the
# experts' split with it. Rows:
# 1. The GPU tests of the modules that build engines under kv auto and the split step.
# 2. `writescope bench` under the defaults (auto), Qwen3-30B-A3B FP8 4 x 32K and DeepSeek-V2-Lite
#    bf16 4 x 32K, --kv-cache-memory auto, 32 GiB: step, bound efficiency, peak VRAM, step forms.
# 3. DeepSeek-V2-Lite bf16 4 x 16K kv auto, one batch against split (plan with call 2's profile:
#    17.6 against 15.3 ms, 4 of 26 layers' experts on the CPU).
# 4. The plan's lines for those rows with this call's calibration.
# 5. A sweep of the FP8 down kernel's launch settings at Qwen3's 2 and 4 tokens (the split
#    step's sub-batches and the whole batch): in call 2 of the fifty-ninth session the FP8 down
#    kernel read half gate/up's bytes in 0.9x its time (1.75 against 1.94 ms a step at 4 x 8K).
# Rows run in the order written; those past the call's deadline are skipped. Carry .whl as in
# call1-full-suite.sh. CALL_S=400.
source bench/results/run-helper.sh
call_begin ${CALL_S:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 150 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_expert_move.py \
  tests/test_kv_cache_memory.py tests/test_pipelined_experts.py tests/test_split_experts_model.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -4
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
bench_row() {  # NAME CAP MODEL CONTEXT [bench args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto --kv-cache-memory auto "$@" --out $R/$name
}
bench_row ds-32k 80 deepseek-v2-lite 32k
bench_row q-fp8-32k 90 qwen3-30b-a3b 32k --config-override "$Q"
run down-sweep 90 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b --tokens 2,4 \
  --weights fp8 --sweep --sweep-kernel down --no-torch --json $R/down-sweep.json
grep -E "default|best" $R/down-sweep.log | tail -6
prof() {  # NAME CAP MODEL CONTEXT [step_profile args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope.bench.step_profile --model $model --random-weights \
    --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context $ctx \
    --prefill synthetic --warmup 4 --steps 6 --top 10 --experts auto --kv-cache-memory auto \
    "$@" --json $R/$name.json
}
WRITESCOPE_PIPELINE_EXPERTS=0 prof ds-16k-one 50 deepseek-v2-lite 16k
WRITESCOPE_PIPELINE_EXPERTS=1 prof ds-16k-split 50 deepseek-v2-lite 16k
for f in ds-16k-one ds-16k-split; do
  [ -f $R/$f.log ] && echo "$f: $(grep -h 'median of' $R/$f.log | cut -c1-300)"; done
for f in q-fp8-32k ds-32k; do grep -h "tok/s" $R/$f.log | head -2; done
for a in "qwen3-30b-a3b 32k --config-override $Q" "deepseek-v2-lite 32k" "deepseek-v2-lite 16k"; do
  set -- $a; for pe in off auto; do
    python -m writescope plan --model $1 --profile $P --vram-budget 32GiB --batch 4 --max-num-batched-tokens 16384 \
      --context-lengths $2 --experts auto --kv-cache-memory auto --pipeline-experts $pe ${@:3} 2>&1 | tail -6 >> $R/plans.txt; done; done
call_end
