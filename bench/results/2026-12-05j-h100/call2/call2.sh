#!/bin/bash
# Decode steps with routed experts on the CPU split into two interleaved sub-batches
# (WRITESCOPE_PIPELINE_EXPERTS), second call. The first (bench/results/2026-12-05j-h100/call1, on
# 7266903) measured FP8 Qwen3-30B-A3B 4 x 8K kv auto 16.9 ms one batch against 12.1 split, but
# 4 x 32K split 52.0 against 42.3: with the split model the kv-auto choice left some KV
# streamed, and the split step then attended eagerly (host 43 ms). Since then `on` splits only
# steps whose sub-batches attend through resident buffers (the step stays graphs), the
# planner's split model applies only to those, and `all` keeps the old behaviour.
# 1. The split step's GPU tests.
# 2. step_profile one batch and split: FP8 4 x 8K and 4 x 32K, bf16 4 x 8K; and `auto` at FP8
#    4 x 8K (the chooser probes both forms). Carry .whl as in call1-full-suite.sh. CALL_S=420.
source bench/results/run-helper.sh
call_begin ${CALL_S:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-split 150 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_pipelined_experts.py
grep -E "passed|failed|^FAILED" $R/gpu-split.log | tail -6
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
prof() {  # NAME CAP CONTEXT [step_profile args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope.bench.step_profile --model qwen3-30b-a3b --random-weights \
    --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context $ctx \
    --prefill synthetic --experts auto --kv-cache-memory auto --warmup 4 --steps 6 --top 10 \
    "$@" --json $R/$name.json
}
WRITESCOPE_PIPELINE_EXPERTS=0 prof fp8-8k-one 60 8k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof fp8-8k-split 60 8k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=0 prof fp8-32k-one 70 32k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof fp8-32k-split 70 32k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=0 prof bf16-8k-one 70 8k
WRITESCOPE_PIPELINE_EXPERTS=1 prof bf16-8k-split 70 8k
WRITESCOPE_PIPELINE_EXPERTS=auto prof fp8-8k-auto 60 8k --config-override "$Q" --warmup 16
for f in fp8-8k-one fp8-8k-split fp8-32k-one fp8-32k-split bf16-8k-one bf16-8k-split fp8-8k-auto; do
  echo "$f: $(grep -h 'median of' $R/$f.log | cut -c1-330)"; done
call_end
