#!/bin/bash
# Forty-first session, call 2: the CPU experts' team with one core left instead of two (15
# threads against the engine's 14), alternated round by round in one process on issue 6's
# experts-on-CPU row (Qwen3-30B-A3B 4 x 128K, 32 GiB: writescope at 14 / 15 / 14 / 15); then
# issue 9's spilled table and issue 8's table on the current tree.
source bench/results/run-helper.sh
call_begin 540
calibrate_profile
run qwen3-cpu 250 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model qwen3-30b-a3b \
  --random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,writescope@expert_threads=15 --batch 4 --context-lengths 128k --out $R/qwen3-cpu
hybrid_table hyb 100
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
