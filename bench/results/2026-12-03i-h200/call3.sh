#!/bin/bash
# Thirty-fourth session, call 3: the resident attention's chunk sizes and tiles at the engine's
# 32K batches, timed as CUDA-graph replays (call 2: Qwen3's step was 0.2 ms faster with 8-block
# chunks than with the default 16; DeepSeek's MLA partials read at ~2.1 TB/s there); the
# DeepSeek-V2-Lite 4 x 32K step at 4- and 8-block chunks, Qwen3 2 x 32K at 4.
source bench/results/run-helper.sh
call_begin 300
run resident 90 python -m writescope.bench.gpu_attention --skip spilled --shapes gqa,mla --batches 2x32K,4x32K,8x32K --json $R/resident.json
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run d4-32k-c4 30 env WRITESCOPE_RESIDENT_CHUNK_BLOCKS=4 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-c4.json
run d4-32k-c8 30 env WRITESCOPE_RESIDENT_CHUNK_BLOCKS=8 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-c8.json
run q2-32k-c4 30 env WRITESCOPE_RESIDENT_CHUNK_BLOCKS=4 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-c4.json
call_end
