#!/bin/bash
# Thirty-ninth session, call 2: issue 6's experts-on-CPU rows, not run since the thirty-first
# session (dependent launches, the planner's new predictions and the recalibration came
# after): Qwen3-30B-A3B 4 x 128K under 32 GiB, all five policies (the configuration whose
# spilled KV per step exceeds the activated experts' bytes: the 1.4x target's), then the batch-1
# rows DeepSeek-V2-Lite 1 x 128K and Qwen3-30B-A3B 1 x 32K (writescope and transfer; at batch 1
# nothing spills under 32 GiB, so the policies do the same work: the rows are for the bound),
# all against this call's calibration.
source bench/results/run-helper.sh
call_begin 555
calibrate_profile 60
cpu_grid qwen3-cpu 300 qwen3-30b-a3b 4 128k
cpu_grid dsv2-b1 80 deepseek-v2-lite 1 128k --policies writescope,transfer
cpu_grid qwen3-b1 90 qwen3-30b-a3b 1 32k --policies writescope,transfer
call_end
