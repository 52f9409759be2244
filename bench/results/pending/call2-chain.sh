#!/bin/bash
# Where issue 6's CPU-experts 4 x 128K step goes beyond its kernels (written in the seventy-ninth
# session, which had no device time). The seventy-eighth's row (bench/results/2026-12-07f-h100,
# call 1): writescope 338.3 ms a step against a 287.5 ms bound, its CPU attention 151 ms and
# experts 146 ms a step; the rest (~41 ms) is waits between them and the step's ends, and the
# planner learned a fixed overhead of 18-26 ms a step. `bench.step_profile --timeline` now lays
# each step's CPU attention and expert kernels on one chain (bench/cpu_chain.py): the waits
# attention -> experts (the device's merge, which needs the layer's staged T blocks, o_proj and
# routing, plus the hand-off) and experts -> attention (the next layer's queries), and the
# step's start and end. The same engine settings as cpu_grid's writescope row, the call's own
# calibration; then the same with the staging ring doubled (1 GiB: does the link's lookahead
# matter?), and with the CPU experts' result read by the GPU's cores in place instead of copied
# by a copy engine that the ring's 268 MB copies keep busy (WRITESCOPE_CPU_EXPERT_RESULT=kernel,
# layers/pinned_read.py: do the experts -> attention waits shrink?). If kernel wins, a later
# call runs the five-policy row under it (cpu_grid ... --policies writescope,static).
# CALL_S=560; Qwen3's random experts take ~60 s to build a run.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 60
chain() {
  local name=$1; shift
  run $name 150 env "$@" python -m writescope.bench.step_profile --model qwen3-30b-a3b \
    --random-weights --profile $P --vram-budget 32GiB --experts cpu --batch 4 --context 128k \
    --max-num-batched-tokens 16384 --prefill synthetic --warmup 4 --steps 6 --top 12 \
    --timeline --json $R/$name.json
  grep -A2 -E "^CPU chain|^CPU expert chain|^decode step" $R/$name.log | head -12
}
chain chain-default WRITESCOPE_STACKS_EVERY_S=150
chain chain-ring1g WRITESCOPE_STAGING_BYTES=1GiB
chain chain-result-kernel WRITESCOPE_CPU_EXPERT_RESULT=kernel
call_end
