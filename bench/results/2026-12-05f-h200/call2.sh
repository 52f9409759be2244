#!/bin/bash
# Planned second call of a session lent a device (rewritten in the fifty-fourth session, whose
# eleven starts were all refused; carry .whl as in call1.sh). Against the machine's own profile
# (calibrated here: the CPU expert kernel's FP8 rates are the exact products' since then):
# 1. Qwen3-30B-A3B under 32 GiB, 1 x 1K and 4 x 8K: bf16 experts on the CPU (issue 6's rows)
#    against an -FP8 release's experts (experts="auto" with its quantization_config: FP8 on
#    the GPU where they fit) and the same FP8 experts on the CPU (the exact products).
# 2. Issue 6's five-policy rows, experts on the CPU, Qwen3 4 x 32K (not re-run since the
#    thirty-ninth session).
# (The CPU expert kernel over FP8 experts and WS_PF_SPREAD moved to call1.sh.)
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
for W in fp8 fp8cpu bf16; do
  O=(--experts cpu); [ $W = fp8 ] && O=(--experts auto --config-override "$Q")
  [ $W = fp8cpu ] && O=(--experts cpu --config-override "$Q")
  run q-$W 110 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --batch 1,4 --context-lengths 1k,8k \
    --policies writescope "${O[@]}" --out $R/q-$W
done
run q4-32k 140 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 32k \
  --policies writescope,static,transfer,cpu,migrate --out $R/q4-32k
call_end
