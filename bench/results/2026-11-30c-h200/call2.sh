#!/bin/bash
# Call 2: GPU tests (stack dump if one stalls), dense prefill kernels, the 32K row with dense
# prefill and ready flags, the CPU kernel under contention/DMA.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
timeout 50 python -m writescope.bench.prefill --json $R/prefill.json > $R/prefill.log 2>&1
cat $R/prefill.log | tail -6
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 220 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
timeout 215 python -m writescope bench --model deepseek-v2-lite --random-weights --vram-budget 48GiB \
  --experts gpu --num-gpu-blocks 128 --max-num-batched-tokens 4096 --batch 4 \
  --context-lengths 8k,32k --decode-steps 32 --policies writescope,transfer,cpu \
  --profile bench/profiles/h200.json --out $R/gpu-experts-32k > $R/gpu-experts-32k.log 2>&1
tail -2 $R/gpu-experts-32k.log
timeout 60 python -m writescope.bench.cpu_contention --threads 16,14 --spinners 0,1 --layout both --dma --reps 30 \
  --json $R/cpu_contention.json > $R/cpu_contention.log 2>&1
tail -16 $R/cpu_contention.log
cd $OUT && tar czf r.tgz r && rm -rf r
