#!/bin/bash
# Twenty-seventh session, call 2: issue 6's experts-on-CPU grid for Qwen3-30B-A3B: batches 1 and
# 4, contexts 1K, 32K, 128K (4 x 128K = 512K tokens, the largest aggregate beside its 54 GiB of
# experts), five policies.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
cpu_grid qwen3-cpu 510 qwen3-30b-a3b 1,4 1k,32k,128k
call_end
