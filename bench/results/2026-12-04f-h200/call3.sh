#!/bin/bash
# Forty-first session, call 3: the GPU test suite on the session's package, issue 9's spilled
# table again, and issue 6's DeepSeek-V2-Lite 4 x 128K row with the experts on the GPU
# (writescope, transfer, cpu; two rounds) against the call's calibration.
source bench/results/run-helper.sh
call_begin 560
gpu_tests 300
calibrate_profile
hybrid_table hyb 100
dsv2_row dsv2 150 --policies writescope,transfer,cpu
call_end
