#!/bin/bash
# Sixty-seventh session: a shared prompt prefix streamed once, and the whole GPU suite on the tree
# that does it (attention/staging.py: a T block that several sequences list -- a prefix found by
# prefix caching -- is moved once a staging piece; WRITESCOPE_STAGE_SHARED=0 moves it once per
# listing, as before).
# 1. bench.shared_prefix: DeepSeek-V2-Lite, random weights, experts on the GPU, G capped at 64
#    blocks so a 32K shared prefix spills; 8 prompts of that prefix + 64 own tokens; transfer
#    (every spilled block in T, streamed) and writescope; each in both modes on one engine.
# 2. The whole GPU suite (H100 hosts 292-401 s: give it 420).
# Carry .whl as in call1-full-suite.sh. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run shared-prefix 130 python -m writescope.bench.shared_prefix --model deepseek-v2-lite \
  --random-weights --vram-budget 48GiB --experts gpu --num-gpu-blocks 64 --prefix 32k \
  --suffix 64 --batch 8 --decode-steps 16 --kv-policies transfer,writescope \
  --max-num-batched-tokens 8192 --profile bench/profiles/h200.json --json $R/shared_prefix.json
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
call_end
