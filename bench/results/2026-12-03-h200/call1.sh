#!/bin/bash
# Twenty-sixth session, call 1: issue 9's spilled table with the hybrid step in both forms,
# alternated share by share (--step-forms single,pipelined, the new default): the pipelined form
# splits a batch of two or more sequences into two sub-batches interleaved as the engine's
# WRITESCOPE_PIPELINE=1 step does, so the CPU attends one while the other's round trip runs.
# Shares up to 0.70 (the CPU waits less for queries, so its best share may rise). Twice, then
# the GPU tests.
source bench/results/run-helper.sh
call_begin 560
S=0,0.5,0.55,0.575,0.6,0.625,0.65,0.675,0.7,1
hybrid_table hyb-a 170 --shares $S
hybrid_table hyb-b 170 --shares $S
gpu_tests 170
call_end
