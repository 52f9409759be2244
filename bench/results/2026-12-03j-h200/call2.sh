#!/bin/bash
# Thirty-fifth session, call 2 (the session's last ~340 s of device time): the 32K steps of
# Qwen3 and DeepSeek with the fused router (logits + routing), the resident step's two launches
# a layer (G+W partials in one; the merge with the self terms and the records' write in the
# other), the shared experts' add in the down kernel and the MLA absorb/values kernels; then the
# full GPU suite in the time left.
source bench/results/run-helper.sh
call_begin 212
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k 25 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run d4-32k 25 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
gpu_tests 200
call_end
