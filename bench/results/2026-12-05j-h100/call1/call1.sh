#!/bin/bash
# Decode steps with routed experts on the CPU split into two interleaved sub-batches
# (WRITESCOPE_PIPELINE_EXPERTS, built in the fifty-ninth session, which had no device: checked on
# the CPU only). The fifty-eighth session's call 3 (bench/results/2026-12-05i-h100) profiled the
# FP8 4 x 8K kv-auto step at 19.6 ms, 9.4 ms of it the device waiting for 6 CPU layers' experts;
# docs/PERFORMANCE.md estimates the split step near 11-12 ms, the roofline's split model 12.1.
# 1. The GPU tests of the split step (graphed, resident per sub-batch, CPU calls captured by
#    halves) and of the graphs module.
# 2. step_profile, the same engine one batch and split, FP8 4 x 8K and 4 x 32K (kv auto: the
#    experts auto places around all the KV in HBM; the CPU layers now spread over the model),
#    and bf16 4 x 8K split, where the model predicts the split slower (27 CPU layers: the GPU
#    has little to overlap). Each line's "decode step" median is the figure to compare.
# Carry .whl as in call1-full-suite.sh. Run with CALL_S=560 and a 600 s timeout.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-split 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_pipelined_experts.py \
  tests/test_graphs.py
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
WRITESCOPE_PIPELINE_EXPERTS=0 prof fp8-8k-one 80 8k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof fp8-8k-split 80 8k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=0 prof fp8-32k-one 80 32k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof fp8-32k-split 80 32k --config-override "$Q"
WRITESCOPE_PIPELINE_EXPERTS=1 prof bf16-8k-split 90 8k
grep -h "decode step\|pipelined\|resident" $R/fp8-*.log $R/bf16-*.log | head -40
call_end
