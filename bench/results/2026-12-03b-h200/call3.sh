#!/bin/bash
# Twenty-seventh session, call 3: issue 6's experts-on-CPU grid for Mixtral-8x7B: batch 2,
# contexts 1K, 8K, 32K, 128K (2 x 128K, the largest aggregate beside its 84 GiB of experts), five
# policies.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
cpu_grid mixtral-cpu 520 mixtral-8x7b 2 1k,8k,32k,128k
call_end
