#!/bin/bash
# Sixty-ninth session, call 3, on the tree that reads shared blocks once for GQA calls only
# (7c5d9d5 and later: MLA's kernel is bound by its products, and call 2's DeepSeek-V2-Lite row
# ran 25.6 ms against transfer's 20.6 with MLA's shared groups).
# 1. bench.cpu_shared at 32K shared and at 448 shared tokens (7 blocks, call 2's DeepSeek row's
#    C prefix) with 128 own: does a small shared set lose on 16 cores?
# 2. The shared-prefix rows again: Qwen3-30B-A3B transfer and writescope (call 2: 47.08 against
#    56.62 ms p50), DeepSeek-V2-Lite transfer and writescope (now each listing read: expect
#    call 2's "each" row, 20.92 against 20.56).
# 3. The whole GPU suite -- run first (cap 400 s), the rows above in the time left.
# Two starts of this call were refused (180 s of device time each). Carry .whl. CALL_S=560
# (timeout 590); with less, the suite gets CALL_S - 150.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
gpu_tests $(( ${CALL_S:-560} - 150 < 400 ? ${CALL_S:-560} - 150 : 400 ))
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
sp() {  # sp NAME CAP MODEL BUDGET POLICIES [ENV...]
  local name=$1 cap=$2 model=$3 budget=$4 pol=$5; shift 5
  run $name $cap env "$@" python -m writescope.bench.shared_prefix --model $model \
    --random-weights --vram-budget $budget --experts gpu --num-gpu-blocks 64 --prefix 32k \
    --suffix 64 --batch 8 --decode-steps 24 --modes once --rounds 1 --kv-policies $pol \
    --max-num-batched-tokens 8192 --profile bench/profiles/h200.json --json $R/$name.json
  python - $R/$name.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    s, m = r["stats"], r["timing_means"]
    print(r["round"], r["kv_policy"], round(r["mean_step_ms"], 2), round(r["p50_step_ms"], 2),
          "share", round(s.get("planner.cpu_share", 0), 3), "shared T to CPU",
          s.get("planner.shared_t_cpu_blocks"), "planned ms",
          round(1e3 * s.get("planner.planned_step_s", 0), 2))
    print("   means:", {k: round(m[k], 5) for k in ("step_s", "host_s", "cpu_s", "cpu_bytes",
          "cpu_t_bytes", "pcie_bytes", "pcie_s", "dev_end_s") if k in m})
    for c in r["jit_compiles"]:
        print("   compile", c["step"], c["at_ms"], c["kernel"][:200])
PY
}
sp sp-qwen3 100 qwen3-30b-a3b 68GiB transfer,writescope
run cpu-shared-small 30 python -m writescope.bench.cpu_shared --prefix 448 --own 128 --reps 41 \
  --json $R/cpu-shared-small.json
tail -7 $R/cpu-shared-small.log
sp sp-dsv2 60 deepseek-v2-lite 48GiB transfer,writescope
run cpu-shared 45 python -m writescope.bench.cpu_shared --json $R/cpu-shared.json
tail -7 $R/cpu-shared.log
call_end
