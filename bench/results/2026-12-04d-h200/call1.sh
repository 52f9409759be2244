#!/bin/bash
# Thirty-ninth session, call 1: the CPU attention team's size in the engine's hybrid steps.
# The engine keeps two of the host's 16 cores out of the CPU kernels' teams (engine.py
# reserved_launch_cores); 14 and 16 were compared in the twenty-first session, 15 never. Issue
# 6's DeepSeek-V2-Lite 4 x 128K and Qwen3-30B-A3B 2 x 128K rows (experts on the GPU) against this
# call's calibration, with policy variants `writescope@cpu_threads=N` (the cache's attention
# team size) alternating with the default in two rounds in one process, and transfer.
source bench/results/run-helper.sh
call_begin 555
calibrate_profile 60
dsv2_row dsv2-threads 215 --policies writescope,writescope@cpu_threads=15,writescope@cpu_threads=16,transfer --decode-steps 12
qwen3_row qwen3-threads 240 --policies writescope,writescope@cpu_threads=15,transfer
call_end
