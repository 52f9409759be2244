#!/bin/bash
# Session 9 (2026-12-01), call 4: GPU tests at the final tree (MLA decode tiles of 64 tokens by
# default; the CPU experts' kernel seconds reported to the planner); the machine's ceilings
# again; resident decode with the new MLA default; DeepSeek-V2-Lite 8 x 128K (1M tokens) with
# CPU experts again (call 3: writescope 9% behind transfer, its planner blind to the experts'
# real time); Mixtral-8x7B 2 x 128K with CPU experts. (static's share is 0 at these budgets,
# the same placement as transfer: left out for time.)
source bench/results/run-helper.sh
call_begin 570
run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
run resident 40 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu"
run dsv2-1m 140 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --out $R/dsv2-1m
run mixtral 250 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model mixtral-8x7b \
  --batch 2 --context-lengths 128k $C --out $R/mixtral
call_end
