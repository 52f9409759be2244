#!/bin/bash
# Planned second call of the next session lent a device (written in the fifty-first session,
# which had none; carry .whl as in run-helper.sh -- it now holds accelerate, which transformers
# needs to load FP8 checkpoints, the FP8 parity oracle).
# 1. The FP8 tests on the H200 host: its AMX path converts FP8 tiles for prefill-sized token
#    blocks (the dev VM has no AMX), and the parity with transformers over FP8 checkpoints.
# 2. The CPU expert kernel, bf16 against FP8 weights (one byte a weight), on the 16-core host:
#    per call time and GB/s of the bytes stored.
# 3. Issue 6's Qwen3-30B-A3B 1 x 1K row with the experts on the CPU, bf16 and FP8 experts (random
#    weights with an -FP8 release's quantization_config): the row whose CPU experts alone took
#    all of the step the target allows.
source bench/results/run-helper.sh
call_begin 560
run fp8-tests 150 python -m pytest -q -p no:cacheprovider tests/test_cpu_experts_fp8.py \
  tests/test_fp8_checkpoints.py
tail -3 $R/fp8-tests.log
run experts-fp8 150 python -m writescope.bench.cpu_experts --models qwen3-30b-a3b \
  deepseek-v2-lite mixtral-8x7b --tokens 1 4 32 --backends cpp --isas amx avx512bf16 \
  --weights bf16 fp8 --min-seconds 0.3 --json $R/cpu_experts_fp8.json
P=bench/profiles/h200.json
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
for W in bf16 fp8; do
  O=(); [ $W = fp8 ] && O=(--config-override "$Q")
  run q1-1k-$W 130 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --batch 1 --context-lengths 1k \
    --policies writescope "${O[@]}" --out $R/q1-1k-$W
done
call_end
