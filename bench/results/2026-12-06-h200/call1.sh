#!/bin/bash
# Sixty-first session, first call (carry .whl as in call1-full-suite.sh; an H100 or an H200).
# The FP8 GPU expert kernels read FP8 bytes at 1.2-2.0 TB/s, about bf16's time (30-50% of the
# copy rate): by the count of conversion instructions (two a weight for the hardware's FP8 ->
# half -> float path, on a pipe of 16 a clock an SM) they are conversion-bound. The packed
# conversion (fp8_convert 19: four weights a 32-bit word, two shifts and a mask a weight, the
# float-bits form of mode 3 without its byte unpacking) does it on the integer pipe. Rows:
# 1. GPU tests: the FP8 fused kernels (every conversion, the packed one's bytes against the
#    byte-at-a-time one), the MoE kernels, and sixtieth's call 3's modules (kv auto under the
#    auto expert form, split steps).
# 2. bench.gpu_experts --fp8-variants over the three models at 1 and 4 tokens (mode 19 and its
#    launch settings beside 1, 3, 9, 11).
# 3. Qwen3-30B-A3B FP8 4 x 8K kv auto (the sixtieth's `writescope bench` row, 13.3 ms p50,
#    bound efficiency 0.79): step_profile under the default conversion and under 19
#    (WRITESCOPE_MOE_LAUNCH).
# 4. `writescope bench` DeepSeek-V2-Lite 4 x 32K kv auto under the defaults (the auto form:
#    split steps as planned).
# Rows run in the order written; those past the deadline are skipped. CALL_S=480.
source bench/results/run-helper.sh
call_begin ${CALL_S:-480}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 170 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_fp8_device_experts.py \
  tests/test_moe_triton.py tests/test_expert_move.py tests/test_kv_cache_memory.py \
  tests/test_pipelined_experts.py tests/test_split_experts_model.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -4
run moe-fp8 100 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b \
  --tokens 1,4 --weights fp8 --fp8-variants --no-torch --json $R/gpu_experts_fp8.json
python - $R/gpu_experts_fp8.json <<'PY' 2>&1 | tee $R/moe-fp8-summary.txt
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    v = {json.dumps(x["config"], sort_keys=True): x["us"] for x in r["variants"]}
    best = min(r["variants"], key=lambda x: x["us"])
    print(r["model"], r["tokens"], "default %.1f" % r["default"]["us"],
          "| 1: %.1f 3: %.1f 19: %.1f 27: %.1f" % tuple(v.get(json.dumps({"fp8_convert": m}), float("nan")) for m in (1, 3, 19, 27)),
          "| best %.1f %s" % (best["us"], best["config"]))
PY
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
prof() {  # NAME CAP MODEL CONTEXT [step_profile args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope.bench.step_profile --model $model --random-weights \
    --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context $ctx \
    --prefill synthetic --warmup 4 --steps 6 --top 10 --experts auto --kv-cache-memory auto \
    "$@" --json $R/$name.json
}
prof q-fp8-8k-m1 75 qwen3-30b-a3b 8k --config-override "$Q"
WRITESCOPE_MOE_LAUNCH='{"fp8_convert": 19}' prof q-fp8-8k-m19 75 qwen3-30b-a3b 8k --config-override "$Q"
for f in q-fp8-8k-m1 q-fp8-8k-m19; do
  [ -f $R/$f.log ] && echo "$f: $(grep -h 'median of' $R/$f.log | cut -c1-300)"; done
run ds-32k 80 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
  --prefill synthetic --no-progress --batch 4 --context-lengths 32k --policies writescope \
  --experts auto --kv-cache-memory auto --out $R/ds-32k
grep -h "tok/s\|peak" $R/ds-32k.log | head -3
python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 --max-num-batched-tokens 16384 \
  --context-lengths 8k --experts auto --kv-cache-memory auto --config-override "$Q" 2>&1 | tail -6 >> $R/plans.txt
python -m writescope plan --model deepseek-v2-lite --profile $P --vram-budget 32GiB --batch 4 --max-num-batched-tokens 16384 \
  --context-lengths 32k --experts auto --kv-cache-memory auto 2>&1 | tail -6 >> $R/plans.txt
call_end
