#!/bin/bash
# Where the `--kv-cache-memory auto` rows' steps go (fifty-eighth session). The fifty-seventh
# session's call 2 (bench/results/2026-12-05h-h100) measured them at 0.55-0.73 of the roofline
# bound with every sequence's KV in HBM: FP8 4 x 8K 17.4 ms (model 13.2), bf16 4 x 8K 83.4 ms
# (model 68.0). `bench.step_profile` times the steps as the engine runs them (graphed) and lists
# the profiled steps' ops; with `--timeline` and WRITESCOPE_CPU_EXPERTS_GRAPHED=0 (the timeline
# times eager expert calls only) it splits the steps along the chain of CPU expert calls: the
# device's own work between calls, and each call's span. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-400}
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
prof() {  # NAME CAP CONTEXT [step_profile args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope.bench.step_profile --model qwen3-30b-a3b --random-weights \
    --profile $P --vram-budget 32GiB --max-num-batched-tokens 16384 --batch 4 --context $ctx \
    --prefill synthetic --experts auto --kv-cache-memory auto --warmup 4 --steps 6 --top 25 \
    "$@" --json $R/$name.json
}
prof fp8-8k-graphed 120 8k --config-override "$Q"
WRITESCOPE_CPU_EXPERTS_GRAPHED=0 prof fp8-8k-chain 120 8k --config-override "$Q" --timeline
WRITESCOPE_CPU_EXPERTS_GRAPHED=0 prof bf16-8k-chain 150 8k --timeline
grep -h "decode step\|chain\|device" $R/*-graphed.log $R/*-chain.log | head -60
call_end
