#!/bin/bash
# Call 2: the CPU side on a native job queue (no GIL between layers) with the kernel's team
# started before each layer's queries and spinning on the ready word; merges spread over the
# team. GPU tests; cpu_contention (team spinning vs starting after the word, 3 ms after the last
# call); DeepSeek-V2-Lite 4 x 32K experts on the GPU: transfer, writescope, cpu, then writescope
# with the old Python worker and no spin (A/B in one call) and pipelined; Qwen3-30B-A3B 4 x 32K
# experts on the GPU (48 layers: the per-layer chain); the hybrid attention bench (MLA).
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 560))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
(free -g; nproc) > $R/host.txt 2>&1
source bench/results/run-helper.sh

run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
C="python -m writescope.bench.cpu_contention --spinners 0 --layout both --reps 40 --gap-ms 3 --spin-us 0,3000"
run contention-spin-2x13k 25 $C --size 2x13K --json $R/contention-spin-2x13k.json
run contention-spin-4x13k 25 $C --size 4x13K --json $R/contention-spin-4x13k.json
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --no-progress"
run dsv2-32k 150 $B --policies transfer,writescope,cpu --out $R/dsv2-32k
run dsv2-32k-old 60 env WRITESCOPE_CPU_QUEUE=python WRITESCOPE_CPU_SPIN_US=0 $B --policies writescope --out $R/dsv2-32k-old
run dsv2-32k-pipe 60 env WRITESCOPE_PIPELINE=1 $B --policies writescope --out $R/dsv2-32k-pipe
run qwen3-gpu-experts 90 python -m writescope bench --random-weights --profile bench/profiles/h200.json \
  --batch 4 --max-num-batched-tokens 16384 --no-progress --model qwen3-30b-a3b --vram-budget 80GiB \
  --experts gpu --num-gpu-blocks 1365 --context-lengths 32k --decode-steps 16 \
  --policies transfer,writescope --out $R/qwen3-gpu-experts
run gpu-attention 40 python -m writescope.bench.gpu_attention --skip resident --staging-mib 512 \
  --shapes mla --shares 0,0.4,0.45,0.5,0.55,0.6,0.65,1 --reps 2 --json $R/gpu_attention.json
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
