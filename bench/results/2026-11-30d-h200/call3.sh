#!/bin/bash
# Call 3: the CPU job's ready wait, kernel and done flag in one native call (no GIL between the
# kernel and the flag); GPU tests; the 32K rows: pipelined writescope (and with a 0.2 ms GIL
# switch interval), not pipelined, the cpu policy; step_profile of the pipelined step.
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 150 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 > $R/gpu_tests.log 2>&1
tail -2 $R/gpu_tests.log
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k"
timeout 60 $B --policies writescope --out $R/pipe-32k > $R/pipe-32k.log 2>&1
tail -1 $R/pipe-32k.log
WRITESCOPE_SWITCH_INTERVAL=0.0002 timeout 60 $B --policies writescope --out $R/pipe-si-32k > $R/pipe-si-32k.log 2>&1
tail -1 $R/pipe-si-32k.log
WRITESCOPE_PIPELINE=0 timeout 60 $B --policies writescope --out $R/nopipe-32k > $R/nopipe-32k.log 2>&1
tail -1 $R/nopipe-32k.log
timeout 70 $B --policies cpu --out $R/cpu-32k > $R/cpu-32k.log 2>&1
tail -1 $R/cpu-32k.log
timeout 70 python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights \
  --batch 4 --context 32768 --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 \
  --profile bench/profiles/h200.json --warmup 6 --steps 3 --top 25 --json $R/step_profile_pipe.json \
  > $R/step_profile_pipe.log 2>&1
tail -30 $R/step_profile_pipe.log
cd $OUT && tar czf r.tgz r && rm -rf r
