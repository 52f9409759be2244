#!/bin/bash
# Session 9 (2026-12-01), call 3: the machine's ceilings measured again at the start (the
# committed profile's CPU read, 127.9 GB/s, is 1.6x what this session's call 1 measured: 78 GB/s
# alone, 72.7 + 46.6 GB/s with H2D; rows' bounds and the planner use this call's profile);
# resident decode timed with queued launches and more MLA tiles; Qwen3-30B-A3B 4 x 128K with
# CPU experts, five policies, with the spill warm-up (writescope verified before the fill);
# DeepSeek-V2-Lite 8 x 128K (1M tokens) with CPU experts, four policies.
source bench/results/run-helper.sh
call_begin 570
run calibrate 60 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
run resident 45 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run qwen3-128k 250 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model qwen3-30b-a3b \
  --batch 4 --context-lengths 128k $C --policies writescope,transfer,cpu,static,migrate --out $R/qwen3-128k
run dsv2-1m 230 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --policies writescope,transfer,cpu,static --out $R/dsv2-1m
call_end
