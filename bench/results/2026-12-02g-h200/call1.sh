#!/bin/bash
# Twenty-second session, call 1: the staging ring's strided copies (one cuMemcpy2DAsync per
# piece and layer for equal runs at equal spacing) -- the copy shapes alone and beside a CPU read
# (bench.h2d_copies), issue 9's spilled table with them, the 64 x 4K rows without them and with
# them again (A/B/A on one host), and the GPU tests.
source bench/results/run-helper.sh
call_begin 500
run h2d-copies 90 python -m writescope.bench.h2d_copies --json $R/h2d_copies.json
hybrid_table hyb-a 120
export WRITESCOPE_COPY_2D=0
hybrid_table hyb-b-no2d 60 --batches 64x4K
unset WRITESCOPE_COPY_2D
hybrid_table hyb-c 60 --batches 64x4K
gpu_tests 240
call_end
