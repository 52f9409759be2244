#!/bin/bash
# Call 3: GPU tests at the final tree; experts on the CPU under a 32 GB budget; the 8K row in the
# other policy order; 2 x 64K.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 150 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json"
timeout 200 $B --vram-budget 32GiB --experts cpu --batch 4 --context-lengths 8k,32k \
  --policies writescope,transfer,cpu --out $R/cpu-experts > $R/cpu-experts.log 2>&1
tail -2 $R/cpu-experts.log
timeout 60 $B --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 8k \
  --policies transfer,writescope --out $R/gpu-experts-8k-order > $R/gpu-experts-8k-order.log 2>&1
tail -2 $R/gpu-experts-8k-order.log
timeout 150 $B --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 2 --context-lengths 64k \
  --policies writescope,transfer --out $R/gpu-experts-64k > $R/gpu-experts-64k.log 2>&1
tail -2 $R/gpu-experts-64k.log
cd $OUT && tar czf r.tgz r && rm -rf r
