#!/bin/bash
# Call 1 (fifth session): GPU tests at HEAD (bf6e73f: the commits the fourth session left unrun
# on the GPU), the split step's per-call cost in isolation (cpu_contention, 2 vs 4 sequences per
# call, item sizes, gaps between calls, beside DMA), the hybrid attention bench (issue 9) with
# the AMX MLA kernel, and the build time of random CPU experts with the native generator plus a
# first Mixtral-8x7B row (issue 6).
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 560))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
(free -g; grep -E "MemTotal|MemAvailable" /proc/meminfo; nproc) > $R/host.txt 2>&1
source bench/results/run-helper.sh

run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
C="python -m writescope.bench.cpu_contention --spinners 0 --layout both --dma --reps 40"
run contention-2x13k 30 $C --size 2x13K --chunk-blocks 0,8,16 --json $R/contention-2x13k.json
run contention-4x13k 30 $C --size 4x13K --chunk-blocks 0,8,16 --json $R/contention-4x13k.json
run contention-2x13k-gap3 25 $C --size 2x13K --chunk-blocks 0 --gap-ms 3 --json $R/contention-2x13k-gap3.json
run gpu-attention 120 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 \
  --shares 0,0.3,0.4,0.45,0.5,0.55,0.6,0.65,0.7,1 --reps 2 --json $R/gpu_attention.json
B="python -m writescope bench --random-weights --profile bench/profiles/h200.json --max-num-batched-tokens 16384 --no-progress"
run mixtral-cpu-experts 230 $B --model mixtral-8x7b --vram-budget 32GiB --experts cpu --batch 2 \
  --num-gpu-blocks 256 --pinned-budget 8GiB --host-budget 8GiB --context-lengths 8k,32k \
  --decode-steps 8 --policies writescope,transfer,cpu --out $R/mixtral-cpu-experts
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
