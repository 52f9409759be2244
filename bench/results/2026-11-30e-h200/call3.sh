#!/bin/bash
# Call 3: a fresh hardware profile (the AMX MLA kernel's rates and the decode chain's measured
# CPU-attention round trip, cpu_attn_roundtrip_s; the committed h200.json still had the old
# kernel's 63 GB/s and a 0.7 ms round trip, so the planner placed too little KV on the CPU at
# prefill); with it: DeepSeek-V2-Lite 4 x 32K experts on the GPU, writescope / static / migrate;
# Qwen3-30B-A3B and Mixtral-8x7B 4 x 32K experts on the GPU, transfer / writescope; where the
# Qwen3 step's host time goes (step_profile); the spinning team at the engine's 14 threads.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 540))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
source bench/results/run-helper.sh

run calibrate 70 python -m writescope calibrate --out $R/h200.json
P=$R/h200.json; [ -s $P ] || P=bench/profiles/h200.json
run contention-spin-14t 20 python -m writescope.bench.cpu_contention --spinners 0 --layout cpu \
  --reps 40 --gap-ms 3 --spin-us 0,3000 --threads 14 --size 2x13K --json $R/contention-spin-14t.json
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile $P --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --no-progress"
run dsv2-32k 140 $B --policies writescope,static,migrate --out $R/dsv2-32k
Q="python -m writescope bench --random-weights --profile $P --batch 4 --max-num-batched-tokens 16384 --no-progress --context-lengths 32k --decode-steps 16 --experts gpu"
run qwen3-gpu-experts 80 $Q --model qwen3-30b-a3b --vram-budget 80GiB --num-gpu-blocks 1365 \
  --policies writescope,transfer --out $R/qwen3-gpu-experts
run mixtral-gpu-experts 90 $Q --model mixtral-8x7b --vram-budget 112GiB --num-gpu-blocks 1024 \
  --policies writescope,transfer --out $R/mixtral-gpu-experts
run step-profile-qwen3 75 python -m writescope.bench.step_profile --model qwen3-30b-a3b --random-weights \
  --batch 4 --context 32768 --vram-budget 80GiB --experts gpu --num-gpu-blocks 1365 \
  --max-num-batched-tokens 16384 --profile $P --warmup 6 --steps 3 --top 25 --json $R/step_profile_qwen3.json
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
