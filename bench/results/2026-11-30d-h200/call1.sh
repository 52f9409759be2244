#!/bin/bash
# Call 1: GPU tests at 18d79ea (ready-flag test fix, GC freeze, planner first-sample/probe/memo,
# hybrid row compaction, activation reserve, review fixes: none had run on the GPU); the 8K/32K
# rows (experts on the GPU) and 2 x 64K, to measure those fixes.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 200 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128"
timeout 215 $B --batch 4 --context-lengths 8k,32k --policies writescope,transfer,cpu \
  --out $R/gpu-experts-32k > $R/gpu-experts-32k.log 2>&1
tail -2 $R/gpu-experts-32k.log
timeout 140 $B --batch 2 --context-lengths 64k --policies writescope,transfer \
  --out $R/gpu-experts-64k > $R/gpu-experts-64k.log 2>&1
tail -2 $R/gpu-experts-64k.log
cd $OUT && tar czf r.tgz r && rm -rf r
