#!/bin/bash
# Sixty-sixth session, call 3: the CPU experts' team at 14 threads against 15 (the new default:
# one of 16 cores reserved, as for the attention team) beyond Qwen3's batch-1 row, where call 2
# found 15 threads 3-6% faster in both rounds: DeepSeek-V2-Lite 1 x 8K batch-1 (every routed
# expert on the CPU), two policy variants alternating in two rounds in one process. (Cut to one
# model: the session had 284 s of device time left.) Not run in the sixty-sixth session: its
# starts were refused. Carry .whl. CALL_S=140 (timeout 170).
source bench/results/run-helper.sh
call_begin ${CALL_S:-140}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 25
run d-threads 95 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
  --decode-steps 24 --prefill synthetic --no-progress --rounds 2 --batch 1 --context-lengths 8k \
  --policies writescope@expert_threads=14,writescope@expert_threads=15 --out $R/d-threads
row_summary d-threads
call_end
