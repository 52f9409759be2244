#!/bin/bash
# Sixty-second session, second call (carry .whl as in call1-full-suite.sh; an H100 or an H200).
# The host's time outside the cache's step, after this session's array-work plan and direct
# detokenization:
# 1. `bench.step_profile` of Qwen3-30B-A3B FP8 4 x 8K kv auto (issue 6's 0.714 row: the cache's
#    split step 11.2 ms against a 13.9 ms mean step on the sixty-first's H100 host), with the
#    cache's step and engine.step's time outside it, and 6 steps under cProfile.
# 2. `writescope bench` under the defaults: that row and DeepSeek-V2-Lite bf16 4 x 32K kv auto
#    (0.896 on the sixty-first's H100 host), as the sixty-first's call 2 ran them.
# Rows run in the order written (the bench row first); those past the deadline are skipped.
# CALL_S=260 runs the calibration, the Qwen3 row and its profile; CALL_S=380 all.
source bench/results/run-helper.sh
call_begin ${CALL_S:-380}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
bench_row() {  # NAME CAP MODEL CONTEXT [bench args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto --kv-cache-memory auto "$@" --out $R/$name
  grep -h "tok/s\|peak" $R/$name.log | tail -1
}
bench_row q-fp8-8k 90 qwen3-30b-a3b 8k --config-override "$Q"
run q-fp8-8k-prof 90 python -m writescope.bench.step_profile --model qwen3-30b-a3b --random-weights \
  --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context 8k \
  --prefill synthetic --warmup 6 --steps 8 --top 10 --experts auto --kv-cache-memory auto \
  --cprofile 6 --config-override "$Q" --json $R/q-fp8-8k-prof.json
grep -h "median of" $R/q-fp8-8k-prof.log | cut -c1-400
bench_row ds-32k 80 deepseek-v2-lite 32k
for f in q-fp8-8k ds-32k; do [ -f $R/$f/results.json ] && python - $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]
print(r.get("model"), r.get("context"), "tok/s", r.get("decode_tokens_per_s"), "p50", r.get("p50_step_s"),
      "eff", r.get("bound_efficiency"), "split steps", r.get("pipelined_steps"))
PY
done
call_end
