#!/bin/bash
# Planned second call of the next session lent a device (rewritten in the fifty-third session;
# carry .whl as in call1.sh). Against the machine's own profile (calibrated here):
# 1. Qwen3-30B-A3B under 32 GiB, 1 x 1K and 4 x 8K: bf16 experts on the CPU (issue 6's rows)
#    against an -FP8 release's experts kept FP8 on the GPU (experts="auto"; random weights with
#    its quantization_config).
# 2. The CPU expert kernel, bf16 against FP8 weights, on the 16-core AMX host.
# 3. The AMX attention kernel's WS_PF_SPREAD=1 (the next pass prefetched over all of this one)
#    against the default at distance 1, on the 16-core host (1.02-1.08x on the 2-core dev VM).
# 4. Issue 6's five-policy rows, experts on the CPU, Qwen3 4 x 32K (not re-run since the
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
run ab-spread 60 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=1" \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K --reps 7 --prefetch-blocks 1 \
  --json $R/ab_spread.json
run q4-32k 150 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 32k \
  --policies writescope,static,transfer,cpu,migrate --out $R/q4-32k
call_end
