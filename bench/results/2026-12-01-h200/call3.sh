#!/bin/bash
# Call 3: GPU tests (the CPU experts' device-waited calls now run on the native job queue); then
# Qwen3-30B-A3B, experts on the CPU, 32 GiB, 4 x 128K -- the row issue 6's experts-on-CPU target is
# about -- with transfer first, the order that never finished twice (session 6 call 4 at 4 x 8K,
# call 2 here at 4 x 128K: no line after the build, no stack on SIGUSR1); every thread's stack is
# printed each 60 s (WRITESCOPE_STACKS_EVERY_S) so a stall shows where it is.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 555))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh
run gpu-tests 120 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run qwen3-128k 540 env WRITESCOPE_STACKS_EVERY_S=60 python -m writescope bench --random-weights \
  --profile bench/profiles/h200.json --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 12 --no-progress --policies transfer,writescope --out $R/qwen3-128k
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
