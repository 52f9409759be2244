#!/bin/bash
# Twenty-third session, call 1: why issue 6's engine rows read less on the CPU side than the
# hybrid bench. DeepSeek-V2-Lite 4 x 128K with the experts on the GPU (38 GiB), against one
# calibration: the default (14 attention threads, one batch a step) with transfer and cpu; then
# the writescope policy with the step as two interleaved sub-batches (WRITESCOPE_PIPELINE=1,
# hides the CPU's per-layer wait for its queries), with 16 threads, and both (cpu at 16 too).
# Then issue 9's spilled table with 7 timed reps per share (the median of 7, not the slower of 2).
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 45
dsv2_row dsv2-base 150 --policies writescope,transfer,cpu
export WRITESCOPE_PIPELINE=1
dsv2_row dsv2-pipe 70 --policies writescope
dsv2_row dsv2-pipe16 110 --policies writescope,cpu --cpu-threads 16
unset WRITESCOPE_PIPELINE
dsv2_row dsv2-16 70 --policies writescope --cpu-threads 16
hybrid_table hyb-7 70 --reps 7
call_end
