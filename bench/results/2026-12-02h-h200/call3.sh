#!/bin/bash
# Twenty-third session, call 3: the wait prefetch (each member of a device-waited CPU call's team
# streams its first item's first 1 MiB into L2 while it waits for the layer's queries; this
# tree's default, WRITESCOPE_CPU_WAIT_PREFETCH_KB=0 turns it off). A/B on issue 9's spilled
# table and on issue 6's DeepSeek-V2-Lite 4 x 128K row with the experts on the GPU (whose CPU
# side waited 10-14 ms a step for its queries in calls 1-2), then the GPU tests.
source bench/results/run-helper.sh
call_begin 545
hybrid_table hyb-wpf 60
export WRITESCOPE_CPU_WAIT_PREFETCH_KB=0
hybrid_table hyb-wpf0 60
calibrate_profile 40
dsv2_row dsv2-wpf0 70 --policies writescope
unset WRITESCOPE_CPU_WAIT_PREFETCH_KB
dsv2_row dsv2-wpf 100 --policies writescope,transfer
gpu_tests 170
call_end
