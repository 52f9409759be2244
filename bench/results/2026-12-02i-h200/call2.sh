#!/bin/bash
# Twenty-fourth session, call 2: the wait prefetch without reservations (each member of a
# device-waited CPU call's team streams one of the call's first items into L2 while the team
# waits for the layer's queries; items still taken from the shared counter) on issue 6's
# DeepSeek-V2-Lite 4 x 128K row with the experts on the GPU, alternated 0 / 1024 / 0 / 1024 KiB,
# then the transfer row for the ratio.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 40
for kb in 0 1024 0 1024; do
  export WRITESCOPE_CPU_WAIT_PREFETCH_KB=$kb
  dsv2_row dsv2-wpf$kb-$((++i)) 80 --policies writescope --rounds 1
done
unset WRITESCOPE_CPU_WAIT_PREFETCH_KB
dsv2_row dsv2-transfer 110 --policies transfer --rounds 1
call_end
