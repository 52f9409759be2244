#!/bin/bash
# Twenty-eighth session, call 1: the GPU tests of the last code (a91f360: HybridAttention's
# Python worker now keeps its own thread count -- never run on the device), a calibration, then
# placement's CPU margin A/B in one process (margin_ab: writescope at 1.4, static, writescope at
# 1.2 and 1.0; DeepSeek-V2-Lite 4 x 128K, experts on the GPU, two alternating rounds).
source bench/results/run-helper.sh
call_begin 560
gpu_tests 140
calibrate_profile
margin_ab margin-ab 330
call_end
