#!/bin/bash
# Twenty-fourth session, call 3: the pipelined decode step (WRITESCOPE_PIPELINE=1, two
# interleaved sub-batches) with each sub-batch's staged T pieces attended at finish() -- the
# stream no longer waits for one sub-batch's copies before the other's dense work, whose queries
# the CPU needs next. DeepSeek-V2-Lite 4 x 128K (experts on the GPU), pipelined / plain
# alternated; Qwen3-30B-A3B 2 x 128K pipelined / plain; then the GPU tests.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 40
for p in 1 0 1 0; do
  export WRITESCOPE_PIPELINE=$p
  dsv2_row dsv2-pipe$p-$((++i)) 80 --policies writescope --rounds 1
done
for p in 1 0; do
  export WRITESCOPE_PIPELINE=$p
  qwen3_row qwen3-pipe$p 110 --policies writescope --rounds 1
done
unset WRITESCOPE_PIPELINE
gpu_tests 170
call_end
