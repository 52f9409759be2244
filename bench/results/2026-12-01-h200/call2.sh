#!/bin/bash
# Call 2: the configuration issue 6's experts-on-CPU target is about -- spilled KV per step above
# the activated experts' bytes. With the default G under 32 GiB (~300K tokens of Qwen3 KV) that is
# Qwen3-30B-A3B 4 x 128K: 21 GB spilled against ~14 GB of activated experts per step (the model:
# writescope 266 ms, transfer 427, cpu 418). Prefill dominates (512K tokens per policy, ~130 s), so
# the warm-up's long request is 4K tokens and the chunk is 16K. Transfer first (a first-policy
# effect was seen with CPU experts), then writescope (its planner unverified at the row's prefill:
# the new half-rate placement target), then cpu.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 560))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh
run qwen3-128k 540 python -m writescope bench --random-weights --profile bench/profiles/h200.json \
  --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu --batch 4 --context-lengths 128k \
  --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --no-progress \
  --policies transfer,writescope,cpu --out $R/qwen3-128k
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
