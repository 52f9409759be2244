#!/bin/bash
# Sixty-seventh session, after its call 3 (2026-12-06g-h100): with a 32K prefix shared by 8
# prompts on DeepSeek-V2-Lite, writescope's decode step took 36.2 ms against transfer's 20.9
# although its CPU reads only a few C blocks. bench.shared_prefix now keeps the mean of every
# timing field the cache reports a step (timing_means: the CPU side's time and waits, the
# link's busy time, the host's planning): where do writescope's extra 15 ms go?
# Carry .whl. CALL_S=150 (timeout 180).
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run shared-prefix-dsv2 110 python -m writescope.bench.shared_prefix --model deepseek-v2-lite \
  --random-weights --vram-budget 48GiB --experts gpu --num-gpu-blocks 64 --prefix 32k \
  --suffix 64 --batch 8 --decode-steps 16 --modes once --kv-policies transfer,writescope \
  --max-num-batched-tokens 8192 --profile bench/profiles/h200.json --json $R/shared-prefix-dsv2.json
python - $R/shared-prefix-dsv2.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["kv_policy"], r["mode"], round(r["mean_step_ms"], 2), r["stats"].get("planner.cpu_share"))
    for k, v in r["timing_means"].items():
        print(f"   {k:24s} {v:.6g}")
PY
call_end
