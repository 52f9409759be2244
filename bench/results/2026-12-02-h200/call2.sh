#!/bin/bash
# Sixteenth session, call 2. Call 1's phase counters: on this host one core's MLA work in L2
# takes 2963 ns per 32-token group (the dev VM: 1484), 3432 ns with all 16 cores busy, so MLA's
# DRAM rate at 16 threads (75-93 GB/s) is as much the work's as the memory's. (1) The Q.K in
# chunks of steps whose B tiles stay in L1 (WS_QK_DC, compiled in, off by default) against the
# default build, side by side, 1 and 16 threads, L2-resident and past the L3; (2) the CPU
# attention bench again on this tree; (3) the GPU tests.
source bench/results/run-helper.sh
call_begin 420
run cpu-phases-dc 150 python -m writescope.bench.cpu_phases --shapes mla-16/1/576 --threads 1,16 \
  --pools 0.5,1536 --prefetch-blocks 1,2 --seconds 1.5 --defines ";WS_QK_DC=12;WS_QK_DC=9" \
  --json $R/cpu_phases-dc.json
run cpu-attn 120 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
gpu_tests 160
call_end
