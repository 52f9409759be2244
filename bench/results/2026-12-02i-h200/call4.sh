#!/bin/bash
# Twenty-fourth session, call 4: issue 6's Qwen3-30B-A3B 2 x 128K row with the experts on the
# GPU, every policy with the pipelined decode step (WRITESCOPE_PIPELINE=1; call 3: writescope
# 138.7 ms pipelined against 150.6 plain), two rounds; then plain writescope once more on the
# same host.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile 40
export WRITESCOPE_PIPELINE=1
qwen3_row qwen3-pipe1-all 330 --policies writescope,transfer,cpu
export WRITESCOPE_PIPELINE=0
qwen3_row qwen3-pipe0 90 --policies writescope --rounds 1
call_end
