#!/bin/bash
# Call 4 (the session's last 4.6 minutes): DeepSeek-V2-Lite 4 x 32K, experts on the GPU, writescope
# and static only -- the planner's half-rate placement before verification and its probes (call 1:
# writescope 47.0 ms with 0 bytes in C, unverified; static 43.6 ms with 1.8 GB in C).
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 170))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh
run dsv2-32k 150 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --max-num-batched-tokens 4096 --decode-steps 24 --profile bench/profiles/h200.json \
  --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k \
  --no-progress --policies writescope,static --out $R/dsv2-32k
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
