#!/bin/bash
# Seventy-fourth session, call 2. Call 1 (an H100 host) put the DeepSeek-V2-Lite 4 x 8K spilled
# step at 20.0 ms on the current tree against 24.3 and 23.6 on 6b8dcb5, and 19.0 with
# WRITESCOPE_FAST_LAUNCH=0: one run of each new form. Here the bound launches on and off,
# alternating, on one host, and a Qwen3 pair. Carry .whl. CALL_S=<seconds>.
source bench/results/run-helper.sh
call_begin ${CALL_S:-220}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
P=$PWD/bench/profiles/h200.json
prof() {  # prof NAME MODEL [ENV=VALUE ...]
  local name=$1 model=$2; shift 2
  run $name 40 env "$@" python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 4 --context 8k --experts gpu \
    --vram-budget 68GiB --num-gpu-blocks 128 --warmup 3 --steps 15 --json $R/$name.json
  grep "^decode step" $R/$name.log | head -1 | cut -c1-120
}
for i in 1 2 3; do
  prof d-fast-$i deepseek-v2-lite X=0
  prof d-nofast-$i deepseek-v2-lite WRITESCOPE_FAST_LAUNCH=0
done
prof q-fast-1 qwen3-30b-a3b X=0
prof q-nofast-1 qwen3-30b-a3b WRITESCOPE_FAST_LAUNCH=0
call_end
