#!/bin/bash
# Sixty-ninth session, call 2: the CPU attention kernel reading a block several sequences list
# once for all of them (attention/shared_reads.py), and the planner giving the CPU shared T
# blocks (read in place, once) now that it does.
# 1. bench.cpu_shared: 8 sequences sharing 32K tokens, 1K own each, GQA 32/4/128 and MLA
#    16/1/576, one layer, shared reads against every listing read (alternating calls).
# 2. The shared-prefix rows of the sixty-eighth session (8 prompts sharing a 32K prefix,
#    experts on the GPU, G capped at 64 blocks): Qwen3-30B-A3B under 68 GiB (its writescope
#    row read the prefix's 93 C blocks 8 times, 4.37 GB a step, and streamed 2.28 GB: 0.974x
#    transfer by p50) and DeepSeek-V2-Lite under 48 GiB; transfer and writescope, then
#    writescope with WRITESCOPE_CPU_SHARED_READS=0 (each listing read; shared T streamed, the
#    sixty-eighth's model).
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run cpu-shared 90 python -m writescope.bench.cpu_shared --json $R/cpu-shared.json
tail -8 $R/cpu-shared.log
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
    print("   means:", {k: round(m[k], 5) for k in ("step_s", "host_s", "host_attend_s", "cpu_s",
          "cpu_bytes", "cpu_t_bytes", "pcie_bytes", "pcie_s", "dev_end_s") if k in m})
    print("   steps", r["step_ms"])
    for c in r["jit_compiles"]:
        print("   compile", c["step"], c["at_ms"], c["kernel"][:200])
PY
}
sp sp-qwen3 170 qwen3-30b-a3b 68GiB transfer,writescope
sp sp-qwen3-each 110 qwen3-30b-a3b 68GiB writescope WRITESCOPE_CPU_SHARED_READS=0
sp sp-dsv2 70 deepseek-v2-lite 48GiB transfer,writescope
sp sp-dsv2-each 45 deepseek-v2-lite 48GiB writescope WRITESCOPE_CPU_SHARED_READS=0
call_end
