#!/bin/bash
# A tree against an older one (here the sixty-first's final 0184b86) on one host, alternating.
# Ran in the sixty-second session (bench/results/2026-12-06b-h100/call3: the new tree 1.4-2.4x
# slower, unresolved) and again in the sixty-third (2026-12-06c-h100/call1: within each other's
# spread, steal 0.03-0.35 s a row -- settled, no regression). Kept for the next A/B: before the
# call `mkdir -p _ab/old && git archive REV writescope | tar -x -C _ab/old` (untracked, not
# ignored, so the device gets it; removed after; never `git add -A` while it exists).
# `writescope bench` of Qwen3-30B-A3B FP8 4 x 8K kv auto under the defaults, new / old / old /
# new (odd rounds new first), the old tree run from _ab/old (python -m puts the working
# directory first on sys.path), each row's /proc/stat cpu line around it. CALL_S=200.
source bench/results/run-helper.sh
call_begin ${CALL_S:-200}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
(cd _ab/old && python -m writescope.bench.provenance) > $R/provenance-old.txt 2>&1
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
# /proc/stat's cpu line before and after each row (steal is its 8th value): time the hypervisor
# took from this guest; odd rounds run the new tree first, even rounds the old.
stat() { echo "$1 $(head -1 /proc/stat)" >> $R/procstat.txt; }
new_row() { stat q-new-$1-begin; bench_row q-new-$1 60 qwen3-30b-a3b 8k --config-override "$Q"; stat q-new-$1-end; }
old_row() { stat q-old-$1-begin; (cd _ab/old && bench_row q-old-$1 60 qwen3-30b-a3b 8k --config-override "$Q"); stat q-old-$1-end; }
for round in $(seq 1 ${ROUNDS:-2}); do
  if [ $((round % 2)) = 1 ]; then new_row $round; old_row $round; else old_row $round; new_row $round; fi
done
python - $R/procstat.txt <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
hz = 100.0
for a, b in zip(rows[::2], rows[1::2]):
    va, vb = [int(x) for x in a[2:]], [int(x) for x in b[2:]]
    d = [y - x for x, y in zip(va, vb)]
    print(a[0].rsplit("-", 1)[0], "steal %.2f s of %.2f s cpu-total (user %.2f sys %.2f idle %.2f)" % (
        d[7] / hz, sum(d) / hz, d[0] / hz, d[2] / hz, d[3] / hz))
PY
for f in $(ls -d $R/q-* | xargs -n1 basename); do [ -f $R/$f/results.json ] && python - $f $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["rows"][0]
print(sys.argv[1], "tok/s %.1f mean %.2f p50 %.2f ms eff %.3f split %s" % (
    r["decode_tokens_per_s"], 1e3 * r["mean_step_s"], 1e3 * r["p50_step_s"],
    r.get("bound_efficiency") or 0, r.get("pipelined_steps")))
PY
done
call_end
