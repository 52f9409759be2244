#!/bin/bash
# Twenty-eighth session, call 2 (back to back with call 1, same machine): placement's CPU margin
# A/B in one process (margin_ab: writescope at 1.4, static, writescope at 1.2 and 1.0;
# DeepSeek-V2-Lite 4 x 128K, experts on the GPU, two alternating rounds), then the batch-1
# CPU-experts profile without the resident steps.
source bench/results/run-helper.sh
call_begin 575
calibrate_profile
margin_ab margin-ab 300
export WRITESCOPE_RESIDENT_ATTENTION=0
host_profile q1-1k-cpu-off 110 1 1k cpu 32GiB
unset WRITESCOPE_RESIDENT_ATTENTION
call_end
