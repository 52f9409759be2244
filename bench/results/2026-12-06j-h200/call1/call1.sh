#!/bin/bash
# Seventieth session, call 1, on the sixty-ninth's final tree (078f93d: shared_reads keeps the
# last four splits; host-side Python, not yet run on a GPU).
# 1. The whole GPU suite first (cap 400 s, or CALL_S - 150 when less).
# 2. Qwen3-30B-A3B's shared-prefix rows, transfer and writescope, two rounds (the sixty-ninth's
#    calls 2 and 3 ran one: 0.831x and 0.877x by p50, before the four-split cache).
# 3. bench.cpu_shared at Mixtral's GQA shape (32 query heads over 8 KV heads of 128) and
#    Qwen3's, 8 sequences sharing 32K: the kernel's gain for Mixtral was not measured.
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
gpu_tests $(( ${CALL_S:-560} - 150 < 400 ? ${CALL_S:-560} - 150 : 400 ))
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
sp() {  # sp NAME CAP MODEL BUDGET POLICIES ROUNDS [ENV...]
  local name=$1 cap=$2 model=$3 budget=$4 pol=$5 rounds=$6; shift 6
  run $name $cap env "$@" python -m writescope.bench.shared_prefix --model $model \
    --random-weights --vram-budget $budget --experts gpu --num-gpu-blocks 64 --prefix 32k \
    --suffix 64 --batch 8 --decode-steps 24 --modes once --rounds $rounds --kv-policies $pol \
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
sp sp-qwen3 150 qwen3-30b-a3b 68GiB transfer,writescope 2
run cpu-shared 60 python -m writescope.bench.cpu_shared --shapes gqa-32/8/128,gqa-32/4/128 \
  --json $R/cpu-shared.json
tail -7 $R/cpu-shared.log
call_end
