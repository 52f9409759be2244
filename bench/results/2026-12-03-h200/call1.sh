#!/bin/bash
# Twenty-sixth session, call 1.
# (a) Issue 9's spilled table with the hybrid step in both forms, alternated share by share
#     (--step-forms single,pipelined, the new default): the pipelined form splits a batch of two
#     or more sequences into two sub-batches interleaved as the engine's split decode step does,
#     so the CPU attends one while the other's round trip runs. Shares up to 0.70.
# (b) Issue 6: Qwen3-30B-A3B 2 x 128K (experts on the GPU), 32 decode steps, one batch a step
#     (WRITESCOPE_PIPELINE=0) against WRITESCOPE_PIPELINE=auto (each step's form chosen from
#     measured step times, engine/stepform.py), alternated.
# (c) The GPU tests; then a second run of (a) with what time is left.
source bench/results/run-helper.sh
call_begin 585
S=0,0.5,0.55,0.575,0.6,0.625,0.65,0.675,0.7,1
hybrid_table hyb-a 150 --shares $S
calibrate_profile 40
for m in 0 auto 0 auto; do
  export WRITESCOPE_PIPELINE=$m
  qwen3_row qwen3-pipe$m-$((++i)) 100 --policies writescope --rounds 1 --decode-steps 32
  unset WRITESCOPE_PIPELINE
  if [ $i = 2 ]; then gpu_tests 170; fi
done
hybrid_table hyb-b 150 --shares $S
call_end
