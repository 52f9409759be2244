#!/bin/bash
# Twenty-second session, call 3 (the tree of call 2, 84af7b1): issue 9's whole table in one run
# (resident, streamed and hybrid rows, both shapes, one combined ceiling) and the spilled table
# once more, with shares from 0.5 (MLA's best was the lowest swept, 0.55, in calls 1 and 2); a
# fresh calibration; issue 6's DeepSeek-V2-Lite 4 x 128K row with the experts on
# the GPU (writescope, transfer, cpu; two rounds).
source bench/results/run-helper.sh
call_begin 470
hybrid_table hyb-full 120 --skip ""
hybrid_table hyb-4 80
calibrate_profile 45
dsv2_row dsv2-gpu-experts 230 --policies writescope,transfer,cpu
call_end
