#!/bin/bash
# Call 1 (sixth session): GPU tests at HEAD; DeepSeek-V2-Lite 4 x 32K, experts on the GPU, all five
# policies -- the first run whose writescope row is prefilled by a verified planner (C blocks placed
# at the target: check planner_verified and host_used_bytes in results.json); Qwen3-30B-A3B with CPU
# experts at 4 x 8K, per-stage log lines (--no-progress) and a stack dump (SIGUSR1) if it is cut.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 540))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh

run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --no-progress"
run dsv2-32k 230 $B --policies writescope,transfer,cpu,static,migrate --out $R/dsv2-32k
run qwen3-cpu-experts 170 python -m writescope bench --random-weights --profile bench/profiles/h200.json \
  --batch 4 --max-num-batched-tokens 16384 --no-progress --model qwen3-30b-a3b --vram-budget 32GiB \
  --experts cpu --num-gpu-blocks 128 --context-lengths 8k --decode-steps 16 \
  --policies writescope,transfer --out $R/qwen3-cpu-experts
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
