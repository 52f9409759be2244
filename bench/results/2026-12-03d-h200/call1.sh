#!/bin/bash
# Twenty-ninth session, call 1: the whole GPU suite on the final code of the twenty-eighth session
# (its last commit never ran there), the batch-1 CPU-experts step's device time (where the
# ~0.43 ms a layer outside the expert kernel goes), and issue 6's experts-on-GPU rows for
# DeepSeek-V2-Lite and Qwen3-30B-A3B with the fused norm/rotation/gate-up and resident steps.
source bench/results/run-helper.sh
call_begin 575
gpu_tests 180
calibrate_profile
host_profile q1-1k-cpu 45 1 1k cpu 32GiB --top 40 --steps 4 --warmup 3 --cprofile 0
G="--random-weights --profile $P --experts gpu --context-lengths 32k,128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run dsv2-gpu 140 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --out $R/dsv2-gpu
run qwen3-gpu 160 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-gpu
call_end
