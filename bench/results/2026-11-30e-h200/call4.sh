#!/bin/bash
# Call 4 (the session's last device time): GPU tests at the final tree; DeepSeek-V2-Lite 4 x 32K
# experts on the GPU with all five policies in one run, planned with the new profile
# (bench/profiles/h200.json from call 3) and static's share now chosen at the bench's batch;
# then Qwen3-30B-A3B experts on the CPU at 4 x 8K with transfer first (the fourth session's
# writescope row ran first after the build and was 18% slower at the same share 0).
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 500))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh

run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --no-progress"
run dsv2-32k 250 $B --policies writescope,transfer,cpu,static,migrate --out $R/dsv2-32k
run qwen3-cpu-experts 120 python -m writescope bench --random-weights --profile bench/profiles/h200.json \
  --batch 4 --max-num-batched-tokens 16384 --no-progress --model qwen3-30b-a3b --vram-budget 32GiB \
  --experts cpu --num-gpu-blocks 128 --context-lengths 8k --decode-steps 16 \
  --policies transfer,writescope,cpu --out $R/qwen3-cpu-experts
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
