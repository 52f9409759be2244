#!/bin/bash
# Sixty-ninth session, call 1: the sixty-eighth's pending call 3 (s68-call3.sh, which see) and
# the whole GPU suite, on tree 6b1e75a. deae5cd (the device-side wait kernel no longer
# specialised on the step's number) and its GPU test have not run on a GPU.
# 1. Shared-prefix DeepSeek-V2-Lite rows, two rounds of transfer and writescope, with the
#    Triton compile log: expect no compile in a timed step and no ~60 ms step.
# 2. The whole GPU suite (cap: what is left, at most 400 s).
# 3. If time is left: writescope with WRITESCOPE_CPU_SPIN_US=0 (the CPU team's 2 ms spin).
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
sp() {  # sp NAME CAP ROUNDS POLICIES [ENV...]
  local name=$1 cap=$2 rounds=$3 pol=$4; shift 4
  run $name $cap env "$@" python -m writescope.bench.shared_prefix --model deepseek-v2-lite \
    --random-weights --vram-budget 48GiB --experts gpu --num-gpu-blocks 64 --prefix 32k \
    --suffix 64 --batch 8 --decode-steps 16 --modes once --rounds $rounds \
    --kv-policies $pol --max-num-batched-tokens 8192 \
    --profile bench/profiles/h200.json --json $R/$name.json
  show $name
}
show() {
python - $R/$1.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["round"], r["kv_policy"], round(r["mean_step_ms"], 2), round(r["p50_step_ms"], 2),
          "steps", r["step_ms"])
    print("   host_attend_ms", r["host_attend_ms"])
    for c in r["jit_compiles"]:
        print("   compile", c["step"], c["at_ms"], c["kernel"][:300])
PY
}
sp sp-dsv2 150 2 transfer,writescope
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
sp sp-dsv2-nospin 75 1 writescope WRITESCOPE_CPU_SPIN_US=0
call_end
