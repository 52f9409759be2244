#!/bin/bash
# Sixty-eighth session, call 3. In calls 1 and 2 (two H100 hosts) the first writescope row of
# the shared-prefix bench (DeepSeek-V2-Lite, 8 prompts sharing a 32K prefix, after a transfer
# row) had one step of ~60 ms among steps of ~20, both times its 8th timed step (the 10th of
# the batch's decode), the host ~56 ms in attention calls (host_attend_s), no garbage
# collection. Found by reading the code after call 2: the device-side wait kernel took the
# step's number as a specialised int, and the 16th hybrid step of a process (the first multiple
# of 16) compiled a second variant. deae5cd marks it not specialised, as the store kernel was.
# The bench now logs every Triton compile during a timed step (bench/jit_log.py) and each
# step's host time in attention: expect no compile in any timed step and no ~60 ms step. Also: call 2's
# second writescope row was host-bound (25.9 ms p50, host 24.9 ms a step, against 19.8).
# Two rounds of transfer and writescope, 16 decode steps each. Then writescope with the CPU
# attention team not spinning for the next layer's queries (WRITESCOPE_CPU_SPIN_US=0; default
# 2000): its work a layer here is the prefix's C blocks, ~10 us, and its 15 threads spin ~2 ms
# after each job, beside the launching thread, whose time in attention calls was 14-17 ms a
# step against transfer's 8-14 (the host's own speed moved 1.7x between call 2's rows).
# Not run in the sixty-eighth session (its device time ran out). Carry .whl. CALL_S=260
# (timeout 280).
source bench/results/run-helper.sh
call_begin ${CALL_S:-260}
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
sp sp-dsv2-nospin 80 2 writescope WRITESCOPE_CPU_SPIN_US=0
call_end
