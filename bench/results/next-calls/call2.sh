#!/bin/bash
# Next session, call 2: Qwen3-30B-A3B, experts on the CPU, 32 GiB budget, 4 x 128K (25 GB of KV
# spilled per step against ~13 GB of activated experts: issue 6's experts-on-CPU target), the
# policies not yet run on a tree with the two-region native CPU side: writescope and cpu
# (transfer: 2026-12-01-h200 call 3, 496 ms). Rows report roofline_bound_s with the corrected
# bound (experts and KV share the CPU's DRAM read).
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 570))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh
run qwen3-128k 560 env WRITESCOPE_STACKS_EVERY_S=60 python -m writescope bench --random-weights \
  --profile bench/profiles/h200.json --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 12 --no-progress --policies writescope,cpu --out $R/qwen3-128k
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
