#!/bin/bash
# Thirty-first session, call 2: the CPU attention tests on the H200 host (its ISAS include avx2,
# which now takes the even/odd form for bf16 KV), then issue 6's 128K rows with the experts on the
# GPU for all three models in one call (the twenty-ninth session's flags; one round, 12 decode
# steps): DeepSeek-V2-Lite 4 x 128K (38 GiB), Qwen3-30B-A3B 2 x 128K (68 GiB), Mixtral-8x7B
# 2 x 128K (98 GiB), writescope, transfer, cpu and static.
source bench/results/run-helper.sh
call_begin 550
run cpu-attn-tests 60 python -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_cpu_attention.py tests/test_cpu_attention_threads.py
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 128k"
run dsv2-128k 110 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-128k
run qwen3-128k 130 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-128k
run mixtral-128k 240 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 $G --out $R/mixtral-128k
call_end
