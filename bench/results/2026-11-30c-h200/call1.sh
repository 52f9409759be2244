#!/bin/bash
# Call 1 of 2026-11-30 (third session): GPU tests at 51c4efa, the CPU kernel beside busy threads,
# and the 32K row of the experts-on-GPU table with sleeping host waits and two reserved cores.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
nproc > $R/nproc.txt; lscpu >> $R/nproc.txt
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 200 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
timeout 60 python -m writescope.bench.cpu_contention --json $R/cpu_contention.json > $R/cpu_contention.log 2>&1
tail -8 $R/cpu_contention.log
timeout 270 python -m writescope bench --model deepseek-v2-lite --random-weights --vram-budget 48GiB \
  --experts gpu --num-gpu-blocks 128 --max-num-batched-tokens 4096 --batch 4 \
  --context-lengths 32k --decode-steps 32 --policies writescope,transfer,cpu \
  --profile bench/profiles/h200.json --out $R/gpu-experts-32k > $R/gpu-experts-32k.log 2>&1
tail -5 $R/gpu-experts-32k.log
cd $OUT && tar czf r.tgz r && rm -rf r
