#!/bin/bash
# Planned second call of the next session lent a device (rewritten in the fifty-third session;
# carry .whl as in call1.sh). Against the machine's own profile (calibrated here):
# 1. Qwen3-30B-A3B under 32 GiB, 1 x 1K and 4 x 8K: bf16 experts on the CPU (issue 6's rows)
#    against an -FP8 release's experts kept FP8 on the GPU (experts="auto"; random weights with
#    its quantization_config).
# 2. The CPU expert kernel, bf16 against FP8 weights, on the 16-core AMX host.
# 3. Issue 6's five-policy rows, experts on the CPU, Qwen3 4 x 32K (not re-run since the
#    thirty-ninth session).
source bench/results/run-helper.sh
call_begin 580
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
for W in fp8 bf16; do
  O=(--experts cpu); [ $W = fp8 ] && O=(--experts auto --config-override "$Q")
  run q-$W 120 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --batch 1,4 --context-lengths 1k,8k \
    --policies writescope "${O[@]}" --out $R/q-$W
done
run experts-fp8 80 python -m writescope.bench.cpu_experts --models qwen3-30b-a3b \
  deepseek-v2-lite mixtral-8x7b --tokens 1 4 32 --backends cpp --weights bf16 fp8 \
  --min-seconds 0.2 --json $R/cpu_experts_fp8.json
run q4-32k 150 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 32k \
  --policies writescope,static,transfer,cpu,migrate --out $R/q4-32k
call_end
