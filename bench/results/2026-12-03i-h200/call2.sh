#!/bin/bash
# Thirty-fourth session, call 2: the fused small kernels (add + RMSNorm, GQA heads, the resident
# W write, the router's compact output) -- the full GPU suite; the 32K steps of the three models
# (step_profile), Qwen3 also at two other resident chunk sizes; the resident attention's chunk
# and tile sweep at the engine's 32K batches (one layer: 2 x 32K and 4 x 32K).
source bench/results/run-helper.sh
call_begin 520
gpu_tests 200
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run d4-32k 30 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run m2-32k 30 $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k.json
run resident 60 python -m writescope.bench.gpu_attention --skip spilled --shapes gqa,mla --batches 2x32K,4x32K --json $R/resident.json
run q2-32k-c8 30 env WRITESCOPE_RESIDENT_CHUNK_BLOCKS=8 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-c8.json
run q2-32k-c32 30 env WRITESCOPE_RESIDENT_CHUNK_BLOCKS=32 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-c32.json
call_end
