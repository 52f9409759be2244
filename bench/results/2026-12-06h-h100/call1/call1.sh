#!/bin/bash
# Sixty-eighth session, call 1. With a 32K prefix shared by 8 prompts on DeepSeek-V2-Lite
# (experts on the GPU, G capped at 64 blocks), writescope's decode step took 36.2 ms against
# transfer's 20.9 (2026-12-06g-h100 call 3), while its link moved the same 0.89 GB a step at
# 24.6 GB/s against transfer's 43.5: its CPU reads only the 7 prefix blocks in C (8 times)
# and the sequences' own. Where do the extra 15 ms go?
# 1. bench.shared_prefix, transfer and writescope, every step with device timing events
#    (WRITESCOPE_TIMING_EVERY=1): the mean of every timing field (CPU time, hand-off and
#    return lags, the copy stream's first/last copy and the device's end), the planner's
#    stats and each step's time.
# 2. writescope again with the launching thread waiting for each layer's CPU result
#    (WRITESCOPE_CPU_WAIT=host): does the device-side wait hold the copies back?
# 3. The whole GPU suite on this tree (last whole run: 998d7be).
# Carry .whl. CALL_S=575 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-575}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
sp() {  # sp NAME CAP POLICIES [ENV...]
  local name=$1 cap=$2 pol=$3; shift 3
  run $name $cap env WRITESCOPE_TIMING_EVERY=1 "$@" python -m writescope.bench.shared_prefix \
    --model deepseek-v2-lite --random-weights --vram-budget 48GiB --experts gpu \
    --num-gpu-blocks 64 --prefix 32k --suffix 64 --batch 8 --decode-steps 16 --modes once \
    --kv-policies $pol --max-num-batched-tokens 8192 --profile bench/profiles/h200.json \
    --json $R/$name.json
}
show() {
  python - $R/$1.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["kv_policy"], r["mode"], round(r["mean_step_ms"], 2), "steps", r["step_ms"])
    for k, v in r["stats"].items():
        if k.startswith("planner."):
            print(f"   {k:32s} {v}")
    for k, v in r["timing_means"].items():
        print(f"   {k:32s} {v:.6g}")
PY
}
sp sp-dsv2 90 transfer,writescope
show sp-dsv2
sp sp-dsv2-hostwait 70 writescope WRITESCOPE_CPU_WAIT=host
show sp-dsv2-hostwait
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
call_end
