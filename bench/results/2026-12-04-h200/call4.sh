#!/bin/bash
# Thirty-sixth session, call 4 (the last ~240 s of device time): issue 6's DeepSeek-V2-Lite
# 4 x 128K row, writescope and transfer, one round, with the decode chain's dependent launches
# (the final code; call 1 ran the same row without them).
source bench/results/run-helper.sh
call_begin 95
P=bench/profiles/h200.json
dsv2_row dsv2-128k 70 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
