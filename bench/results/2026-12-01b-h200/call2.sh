#!/bin/bash
# Session 9 (2026-12-01), call 2: issue 6's experts-on-CPU grid for Qwen3-30B-A3B (32 GiB budget), all
# five policies at 4 x 32K and 4 x 128K (4 x 128K spills 25 GB of KV per step against ~13 GB
# of activated experts), with --prefill synthetic: random KV written to the homes each policy
# chooses, so a 128K row costs seconds of filling instead of ~150 s of prefill (rows carry no
# TTFT; 2026-12-01-h200 call 3 has a real 4 x 128K prefill: 91-94 s TTFT). Rows report the
# corrected roofline bound (experts and KV share the CPU's DRAM read).
source bench/results/run-helper.sh
call_begin 570
run qwen3-cpu-experts 560 env WRITESCOPE_STACKS_EVERY_S=60 python -m writescope bench \
  --random-weights --profile bench/profiles/h200.json --model qwen3-30b-a3b --vram-budget 32GiB \
  --experts cpu --batch 4 --context-lengths 32k,128k --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress \
  --policies writescope,transfer,cpu,static,migrate --out $R/qwen3-cpu-experts
call_end
