#!/bin/bash
# Thirty-fourth session, call 5: the final package (call 4's + each hybrid GPU-side source's
# chunks sized for its own launch) -- the full GPU suite; DeepSeek-V2-Lite 4 x 128K
# writescope/transfer, one round (the hybrid path: G, T and C blocks).
source bench/results/run-helper.sh
call_begin 390
gpu_tests 200
P=bench/profiles/h200.json
dsv2_row dsv2-128k 80 --policies writescope,transfer --decode-steps 12 --rounds 1
call_end
