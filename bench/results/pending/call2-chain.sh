#!/bin/bash
# Where issue 6's CPU-experts 4 x 128K step goes beyond its kernels (written in the seventy-ninth
# session, which had no device time). The seventy-eighth's row (bench/results/2026-12-07f-h100,
# call 1): writescope 338.3 ms a step against a 287.5 ms bound, its CPU attention 151 ms and
# experts 146 ms a step; the rest (~41 ms) is waits between them and the step's ends, and the
# planner learned a fixed overhead of 18-26 ms a step. `bench.step_profile --timeline` lays
# each step's CPU attention and expert kernels on one chain (bench/cpu_chain.py): the waits
# attention -> experts (the device's merge, which needs the layer's staged T blocks, o_proj and
# routing, plus the hand-off) and experts -> attention (the next layer's queries), and the
# step's start and end, and the link's busy and idle time. Five variants on one host, one process each (the chain helper in
# run-helper.sh), the call's own calibration:
# - chain-equal: the defaults (since the eightieth session a layer's 276 MB of T blocks is two
#   138 MB pieces in 3 slots of the 512 MiB ring: 1.5 layers in flight);
# - chain-unequal: WRITESCOPE_STAGING_EQUAL_PIECES=0, as before (268 + 8 MB in 2 slots);
# - chain-ahead: WRITESCOPE_STAGING_AHEAD=1 (the next step's first units staged during this
#   step's last layers: the link's idle time after its last copy, bench/link_idle.py);
# - chain-ring1g: a 1 GiB ring (whole layers, 3 in flight: does more lookahead matter?);
# - chain-result-kernel: the CPU experts' result read by the GPU's cores in place instead of
#   copied by a copy engine that the ring's copies keep busy (WRITESCOPE_CPU_EXPERT_RESULT=kernel,
#   layers/pinned_read.py: do the experts -> attention waits shrink?).
# CALL_S=560; Qwen3's random experts take ~60 s to build a run.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 50
chain chain-equal 95
chain chain-ahead 95 WRITESCOPE_STAGING_AHEAD=1
chain chain-unequal 95 WRITESCOPE_STAGING_EQUAL_PIECES=0
chain chain-ring1g 95 WRITESCOPE_STAGING_BYTES=1GiB
chain chain-result-kernel 95 WRITESCOPE_CPU_EXPERT_RESULT=kernel
call_end
