#!/bin/bash
# Next session, call 3: the rest of issue 6's experts-on-CPU grid with --prefill synthetic:
# DeepSeek-V2-Lite at 8 x 128K (1M tokens: the largest aggregate the issue names; G holds
# ~985K tokens at 32 GiB, so ~2 GB spills) and Mixtral-8x7B at 2 x 64K (fits G: no spill) and
# 2 x 128K (~4 GB spills; G holds ~229K tokens), 32 GiB budgets, all policies but migrate.
source bench/results/run-helper.sh
call_begin 570
C="--random-weights --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run dsv2-1m 250 env WRITESCOPE_STACKS_EVERY_S=60 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --out $R/dsv2-1m
run mixtral 300 env WRITESCOPE_STACKS_EVERY_S=60 python -m writescope bench --model mixtral-8x7b \
  --batch 2 --context-lengths 64k,128k $C --out $R/mixtral
call_end
