#!/bin/bash
# For the session after the sixty-sixth (whose starts for it were refused): issue 6's batch-1
# rows, every routed expert on the CPU, in two parts, most important first.
# 1. The CPU experts' team at 14 threads against 15 (the default since the sixty-sixth session:
#    one of 16 cores reserved, as for the attention team) beyond Qwen3's batch-1 row, where
#    2026-12-06f-h100 call 2 found 15 threads 3-6% faster in both rounds: DeepSeek-V2-Lite
#    1 x 8K, two policy variants alternating in two rounds in one process.
# 2. The batch-1 rows against every other policy (never run: with all KV in HBM the policies do
#    the same work, so this shows the 3% line and the machine's noise), Qwen3-30B-A3B 1 x 1K and
#    DeepSeek-V2-Lite 1 x 8K, where time is left.
# Carry .whl. CALL_S=330 (timeout 360); part 1 alone needs CALL_S=140.
source bench/results/run-helper.sh
call_begin ${CALL_S:-330}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 25
b1() {  # b1 NAME CAP MODEL CONTEXT ARGS...: a batch-1 row, every routed expert on the CPU
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --batch 1 --context-lengths $ctx \
    "$@" --out $R/$name
  row_summary $name
}
b1 d-threads 95 deepseek-v2-lite 8k --rounds 2 \
  --policies writescope@expert_threads=14,writescope@expert_threads=15
b1 q-policies 90 qwen3-30b-a3b 1k --policies writescope,transfer,cpu,static,migrate
b1 d-policies 100 deepseek-v2-lite 8k --policies writescope,transfer,cpu,static,migrate
call_end
