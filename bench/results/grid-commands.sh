#!/bin/bash
# Issue 6, first full-size rows of Qwen3-30B-A3B and Mixtral-8x7B (random weights), one device
# call (nvidia-h200: one H200, 16-core Xeon, 128 GiB host RAM), <= 560 s in all. Memory plan and
# the reasoning behind every number: bench/results/grid-plan.md.
#
# Order = priority. Each bench gets a cap (timeout) and all of them share one deadline, so the
# tarball is always written; results.json is rewritten after every row, so a bench cut by its
# timeout keeps the rows it finished (policies run in the order written: writescope first).
#
# Time estimates (H200 figures: CPU experts 64-96 GB/s of weights, H2D 54 GB/s, prefill
# attention ~340 TFLOP/s (FA2, GQA), DeepSeek-V2-Lite 4 x 32K prefill 13-17 s mean TTFT with
# its experts on the GPU; the random experts are drawn by 14 threads at ~2 G values/s (one core
# draws ~0.17 G/s: DeepSeek-V2-Lite's 14.4 G took 85.6 s before they were drawn in parallel)):
#
# 1. Qwen3-30B-A3B, experts on the CPU (54.0 GiB host, page-locked), 32 GiB budget, G = 128
#    blocks (8K tokens, 0.75 GiB): at 4 x 32K 11.3 GiB of KV spill; T = C = 11.3 GiB (default).
#    build ~30 s: experts 29.0 G values ~15 s, page-locking 54 GiB ~3 s, the activation
#    forward of 16K tokens (uploads 58 GB of experts) ~4 s, start-up ~6 s.
#    per policy ~45 s: warm-up (one 8K prompt, 4 x 64 tokens: every expert read once) ~5 s;
#    8K row: prefill 2 chunks x (upload 1.1 s + ~1.5 s) ~6 s, 16 decode steps x ~0.2 s (29 of
#    128 experts per layer hit by 4 tokens x top-8 = 13.2 GB of experts per step at ~75 GB/s
#    = 0.18 s) ~3 s; 32K row: prefill of 131K tokens in 9 chunks of <= 16K: uploads 9 x 1.1 s,
#    attention ~5 s, experts + their Python loop (128 experts x 48 layers a chunk) ~8 s =
#    ~23 s, 16 steps x 0.2-0.35 s (transfer: 12 GB over PCIe per step; cpu: experts + KV on
#    the CPU) ~5 s. First policy + ~15 s of Triton compiles. Total ~180 s (cap 190).
# 2. Mixtral-8x7B, experts on the CPU (84.0 GiB host, page-locked), G = 640 blocks (40K
#    tokens, 5 GiB), T = C = 11.5 GiB: 84 + 23 = 107 GiB of 125.9 GiB (MemTotal) at the peak
#    (the C pages are resident only once written; the cpu policy writes them all).
#    build ~40 s: experts 45.1 G values ~23 s, page-locking 84 GiB ~5 s, activation forward
#    (uploads 90 GB) ~5 s, start-up ~6 s.
#    per policy ~50 s: warm-up (one 32K prompt: 2 chunks x (1.7 s upload + ~1.5 s) + 2 steps;
#    4 x 64 tokens: all 90 GB of experts read by the CPU ~1.2 s) ~10 s; 4 x 32K row: prefill 9
#    chunks x (1.7 s upload + ~1.2 s) ~26 s, 12 decode steps x ~0.7 s (5.5 of 8 experts per
#    layer hit by 4 tokens x top-2 = 61.6 GB per step at ~93 GB/s = 0.66 s, the KV's 11 GB
#    beside it over PCIe or on the CPU) ~9 s. Total ~190 s (cap 200).
# 3. Qwen3-30B-A3B, experts on the GPU, G = 1365 blocks (8 GiB of KV in HBM), 80 GiB budget:
#    at 4 x 32K 4.0 GiB spill. build ~12 s (weights drawn on the GPU); per policy ~22 s
#    (warm-up 32K ~4 s, prefill ~14 s, 16 steps x ~0.1 s); + ~10 s of compiles. ~70 s (cap 75).
# 4. Mixtral-8x7B, experts on the GPU, G = 1024 blocks (8 GiB), 112 GiB budget: 8.1 GiB
#    spill. build ~12 s; per policy ~20 s (prefill ~11 s, 16 steps x ~0.15 s). ~60 s (cap 65).
# Sum of the caps: 530 s, plus pip (~10-60 s) and the tarball; the shared deadline (540 s after
# the start) cuts 3 and 4 first if 1 and 2 run long.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 540))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
(free -g; grep -E "MemTotal|MemAvailable|Hugepagesize" /proc/meminfo; nproc) > $R/host.txt 2>&1

source bench/results/run-helper.sh  # run NAME CAP_S COMMAND...: timeout = min(CAP_S, time left)

B="python -m writescope bench --random-weights --profile bench/profiles/h200.json --batch 4 --max-num-batched-tokens 16384 --no-progress"
run qwen3-cpu-experts 190 $B --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --num-gpu-blocks 128 --context-lengths 8k,32k --decode-steps 16 --policies writescope,transfer,cpu \
  --out $R/qwen3-cpu-experts
run mixtral-cpu-experts 200 $B --model mixtral-8x7b --vram-budget 32GiB --experts cpu \
  --num-gpu-blocks 640 --pinned-budget 11.5GiB --host-budget 11.5GiB --context-lengths 32k \
  --decode-steps 12 --policies writescope,transfer,cpu --out $R/mixtral-cpu-experts
run qwen3-gpu-experts 75 $B --model qwen3-30b-a3b --vram-budget 80GiB --experts gpu \
  --num-gpu-blocks 1365 --context-lengths 32k --decode-steps 16 --policies writescope,transfer \
  --out $R/qwen3-gpu-experts
run mixtral-gpu-experts 65 $B --model mixtral-8x7b --vram-budget 112GiB --experts gpu \
  --num-gpu-blocks 1024 --context-lengths 32k --decode-steps 16 --policies writescope,transfer \
  --out $R/mixtral-gpu-experts
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
