#!/bin/bash
# Planned third call of the next session lent a device (written in the fifty-second session,
# which had none; carry .whl as in run-helper.sh). FP8 experts kept FP8 on the GPU
# (StackedExperts(fp8=...), the fused kernels' FP8 path), never yet run on a GPU:
# 1. Their GPU tests (the fused kernels against the bf16 kernels over the dequantized experts,
#    bit for bit, both conversions; the engine eager and graphed against the dequantized
#    checkpoint) and the fused MoE's own.
# 2. The decode MoE kernels, bf16 against FP8 weights, GB/s of the bytes stored against the HBM
#    copy rate: does the conversion keep them read-bound?
# 3. Qwen3-30B-A3B under 32 GiB: bf16 experts (on the CPU, the issue-6 row) against an -FP8
#    release's (experts="auto": ~45 of 48 layers' experts then fit on the GPU), batch 1 x 1K
#    and 4 x 8K.
source bench/results/run-helper.sh
call_begin 560
run fp8-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu --tb=short -rf \
  tests/test_fp8_device_experts.py tests/test_moe_triton.py
tail -3 $R/fp8-gpu-tests.log
run moe-fp8 120 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b \
  --tokens 1,2,4,8 --weights bf16,fp8 --no-torch --json $R/gpu_experts_fp8.json
P=bench/profiles/h200.json
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
for W in bf16 fp8; do
  O=(--experts cpu); [ $W = fp8 ] && O=(--experts auto --config-override "$Q")
  run q-$W 120 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --batch 1,4 --context-lengths 1k,8k \
    --policies writescope "${O[@]}" --out $R/q-$W
done
call_end
