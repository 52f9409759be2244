#!/bin/bash
# Seventieth session, call 2: issue 8's table and issue 6's experts-on-GPU rows on the current
# code (last run together in the fifty-sixth session, call 3, on an H100 host: GQA 78-107% /
# MLA of the best vector probe by median; DeepSeek-V2-Lite 4 x 128K 1.737x transfer, 1.310x
# cpu; Qwen3-30B-A3B 2 x 128K 1.668x / 1.672x). The same commands as that call, with Qwen3's
# row in one round so that it finishes.
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 50
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
dsv2_row dsv2 170 --policies writescope,transfer,cpu
qwen3_row q2-128k 200 --policies writescope,transfer,cpu --rounds 1
call_end
