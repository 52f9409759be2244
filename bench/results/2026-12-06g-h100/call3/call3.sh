#!/bin/bash
# Sixty-seventh session, after its call 1 (pending/s67-call2.sh, 2026-12-06g-h100): writescope's decode steps on
# 8 prompts sharing a 32K prefix took 70 ms against transfer's 19 ms, as its CPU read the
# shared prefix's oldest T blocks in place once per sequence. Now the T blocks two or more
# sequences hold are left to the link (kvcache/step_plan.py). Both models:
# 1. bench.shared_prefix, DeepSeek-V2-Lite (MLA), experts on the GPU, 48 GiB, G capped at 64
#    blocks, 8 prompts of a 32K shared prefix + 64 own tokens; transfer and writescope, each
#    with the shared blocks staged once and once per sequence.
# 2. The same on Qwen3-30B-A3B (GQA 32/4/128), experts on the GPU, 68 GiB.
# 3. The whole GPU suite (call 2's host: 212 s; H100 hosts up to 401 s).
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
sp() {  # sp NAME CAP MODEL BUDGET
  run $1 $2 python -m writescope.bench.shared_prefix --model $3 --random-weights \
    --vram-budget $4 --experts gpu --num-gpu-blocks 64 --prefix 32k --suffix 64 --batch 8 \
    --decode-steps 16 --kv-policies transfer,writescope --max-num-batched-tokens 8192 \
    --profile bench/profiles/h200.json --json $R/$1.json
}
sp shared-prefix-dsv2 100 deepseek-v2-lite 48GiB
sp shared-prefix-qwen3 150 qwen3-30b-a3b 68GiB
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
call_end
