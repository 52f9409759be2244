#!/bin/bash
# Twenty-eighth session, call 1: where a Qwen3-30B-A3B decode step's host time goes -- batch 1
# at 1K with the experts on the CPU (the grid's 0.52-0.61 rows: ~0.45 ms a layer that is neither
# the experts nor the GPU's work) and batch 2 at 32K with the experts on the GPU (host-bound,
# 0.18-0.42 of the bound) -- then placement's CPU margin A/B in one process (margin_ab:
# writescope at 1.4, static, writescope at 1.2 and 1.0; DeepSeek-V2-Lite 4 x 128K, experts on
# the GPU, two alternating rounds). The GPU tests wait for this session's code (a later call).
source bench/results/run-helper.sh
call_begin 575
calibrate_profile
host_profile q1-1k-cpu 100 1 1k cpu 32GiB
host_profile q2-32k-gpu 100 2 32k gpu 68GiB
margin_ab margin-ab 300
call_end
