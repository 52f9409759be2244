#!/bin/bash
# Twenty-seventh session, call 1: the GPU tests of the last code (61f6f96, never run on the
# device), then issue 6's experts-on-CPU grid for DeepSeek-V2-Lite: batches 1 and 8, contexts
# 1K-128K (8 x 128K = 1M tokens, the largest aggregate 128 GiB of host holds), five policies.
source bench/results/run-helper.sh
call_begin 560
gpu_tests 135
calibrate_profile
cpu_grid dsv2-cpu 380 deepseek-v2-lite 1,8 1k,8k,32k,128k
call_end
