#!/bin/bash
# Sixty-eighth session, call 2. Call 1 (every step with device timing events) gave writescope
# 20.84 ms p50 against transfer's 19.80 on 8 prompts sharing a 32K prefix (DeepSeek-V2-Lite),
# where the sixty-seventh's call 3 (another host, tree 998d7be, the default timing) gave 31.95
# against 20.53; and one writescope step took 59 ms among steps of ~20.5. Now:
# 1. The same row on this tree with the default timing (WRITESCOPE_TIMING_EVERY unset), two
#    rounds in turn, 24 decode steps each: each step's time, its garbage collections (gc_ms)
#    and the cache's timing of the slowest step.
# 2. The whole GPU suite.
# 3. Qwen3-30B-A3B, the same (one round), with the time left.
# Since its first (refused) start the planner's model counts a shared T block once on the link
# (note_shared / SeqKV.shared_t; roofline fixed_t): planner.planned_step_s should now be near
# the measured step.
# Carry .whl. CALL_S=520 (timeout 550).
source bench/results/run-helper.sh
call_begin ${CALL_S:-520}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
sp() {  # sp NAME CAP MODEL BUDGET ROUNDS
  run $1 $2 python -m writescope.bench.shared_prefix --model $3 --random-weights \
    --vram-budget $4 --experts gpu --num-gpu-blocks 64 --prefix 32k --suffix 64 --batch 8 \
    --decode-steps 24 --modes once --rounds $5 --kv-policies transfer,writescope \
    --max-num-batched-tokens 8192 --profile bench/profiles/h200.json --json $R/$1.json
  python - $R/$1.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    s = r["stats"]
    print(r["round"], r["kv_policy"], round(r["mean_step_ms"], 2), round(r["p50_step_ms"], 2),
          "share", round(s.get("planner.cpu_share", 0), 3), "planned ms",
          round(1e3 * s.get("planner.planned_step_s", 0), 2), "steps", r["step_ms"])
    print("   gc_ms", r["gc_ms"])
    t = r["slowest_step_timing"]
    print("   slowest:", {k: round(v, 5) for k, v in t.items()})
    m = r["timing_means"]
    print("   means:", {k: round(m[k], 5) for k in ("step_s", "host_s", "host_attend_s", "cpu_s",
          "pcie_s", "dev_end_s", "dev_last_copy_s") if k in m})
PY
}
sp sp-dsv2 120 deepseek-v2-lite 48GiB 2
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
sp sp-qwen3 150 qwen3-30b-a3b 68GiB 1
call_end
