#!/bin/bash
# Third call of the fifty-fifth session (carry .whl): checks on the GPU what the session changed
# after its first two calls:
# 1. FP8 experts' gate/up kernel at 32 rows a program (moe_triton.FP8_GATE_UP_ROWS; bf16's 8
#    before): the GPU tests of the fused kernels, then the FP8 rows at 1-8 tokens with the new
#    default and with the old 8 rows (WRITESCOPE_MOE_LAUNCH), one after the other.
# 2. The planner's per-layer expert placement: Qwen3-30B-A3B FP8 with --experts auto under 32 GiB
#    (47 of 48 layers' experts on the GPU), whose bound and model had charged every layer's
#    experts to the CPU (call 2's rows: "roofline efficiency" 1.45).
source bench/results/run-helper.sh
call_begin ${CALL_S:-300}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 120 python -m pytest -m gpu -v -p no:cacheprovider --tb=short -rf \
  -o faulthandler_timeout=60 tests/test_fp8_device_experts.py tests/test_moe_triton.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -4
M="--models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b --tokens 1,2,4,8 --weights fp8 --no-torch"
run moe-fp8-rows32 45 python -m writescope.bench.gpu_experts $M --json $R/gpu_experts_fp8_rows32.json
run moe-fp8-rows8 45 env WRITESCOPE_MOE_LAUNCH='{"gate_up_rows":8}' python -m writescope.bench.gpu_experts \
  $M --json $R/gpu_experts_fp8_rows8.json
grep -E "^(qwen3|deepseek|mixtral)" $R/moe-fp8-rows32.log $R/moe-fp8-rows8.log
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
run q-fp8 90 python -m writescope bench --model qwen3-30b-a3b --random-weights \
  --profile bench/results/2026-12-05f-h200/call2/h200-profile.json --vram-budget 32GiB \
  --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 --prefill synthetic \
  --no-progress --batch 1,4 --context-lengths 1k,8k --policies writescope --experts auto \
  --config-override "$Q" --out $R/q-fp8
call_end
