#!/bin/bash
# Thirty-seventh session, call 2: the routed experts' new launch settings (gate/up 8 rows over 8
# warps, down over 4 warps; bench.gpu_experts --sweep in call 1) -- the GPU suite, the 32K decode
# steps with them and with the old ones (WRITESCOPE_MOE_LAUNCH), issue 6's 32K rows.
source bench/results/run-helper.sh
call_begin 540
gpu_tests 200
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run q2-32k-old 45 env WRITESCOPE_MOE_LAUNCH='{"gate_up_rows":16,"gate_up_warps":4,"down_warps":8}' $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-old.json
run d4-32k 45 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run d4-32k-old 45 env WRITESCOPE_MOE_LAUNCH='{"gate_up_rows":64,"gate_up_warps":4,"down_warps":8}' $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-old.json
run m2-32k 45 $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k 70 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k
run dsv2-32k 60 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-32k
call_end
