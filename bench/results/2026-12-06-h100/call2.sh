#!/bin/bash
# Sixty-first session, second call (carry .whl as in call1-full-suite.sh; an H100 or an H200).
# 1. The whole GPU suite on this tree (the sixtieth's planner/engine changes for the auto expert
#    form, and this session's step-form prior: split expert steps start from the form the
#    planner predicts faster).
# 2. `writescope bench` under the defaults: DeepSeek-V2-Lite bf16 4 x 32K kv auto (call 1 kept
#    one batch in 21 of 24 steps: 30.1 ms p50 against split's 27.0) and Qwen3-30B-A3B FP8
#    4 x 8K kv auto (sixtieth call 2 on an H100: 293.0 tok/s, p50 13.3 ms).
# 3. Issue 8's table on this host (`python -m writescope.bench.cpu_attention`, 16 threads).
# GPU_TESTS="tests/a.py tests/b.py" runs those GPU tests instead of the whole suite.
# Rows run in the order written; those past the deadline are skipped. CALL_S=520.
source bench/results/run-helper.sh
call_begin ${CALL_S:-520}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
if [ -n "$GPU_TESTS" ]; then  # a subset (a short call): the modules that build engines with CPU experts
  run gpu-tests 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
    -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 $GPU_TESTS
else
  gpu_tests 300
fi
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
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
bench_row ds-32k 80 deepseek-v2-lite 32k
bench_row q-fp8-8k 90 qwen3-30b-a3b 8k --config-override "$Q"
for f in ds-32k q-fp8-8k; do [ -f $R/$f/results.json ] && python - $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]
print(r.get("model"), r.get("context"), "split steps", r.get("pipelined_steps"), json.dumps(r.get("step_forms")))
PY
done
run cpu-attn 100 python -m writescope.bench.cpu_attention --json $R/cpu_attention.json
grep -A8 "^shape" $R/cpu-attn.log | head -9; grep "best read of any method" $R/cpu-attn.log
call_end
