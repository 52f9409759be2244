#!/bin/bash
# Ran at f613d16. The WS_TILED build was taken out in cb1a5d4: to repeat this call, check out f613d16 first.
# Seventeenth session, call 1. Does the AMX kernel read faster when every tile it loads is one
# contiguous 1 KB (the C layout's 32-token groups stored tile by tile, -DWS_TILED=1) instead of
# 16 rows 2*R*2 bytes apart? Same bytes, same products; `bench.cpu_phases --defines` runs both
# builds side by side over the same pool (the tiled build's output is not checked there: its
# indexing is checked against the oracle on emulated tiles, tests/test_cpu_attention_amx_emu.py).
# Then the host's core topology (are the 16 vCPUs 16 cores?) and the GPU tests.
source bench/results/run-helper.sh
call_begin 420
(lscpu; grep -m1 -E "siblings|cpu cores" /proc/cpuinfo; grep -E "cpu cores|siblings" /proc/cpuinfo | sort | uniq -c; \
 cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list) > $R/topology.txt 2>&1
run phases 170 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 1,16 \
  --pools 0.5,1536 --prefetch-blocks 0,1,2 --seconds 1.0 --defines ";WS_TILED=1" --json $R/cpu_phases.json
# the DRAM rows again, the builds in the other order
run phases-again 60 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 16 \
  --pools 1536 --prefetch-blocks 1,2 --seconds 1.0 --defines "WS_TILED=1;" --json $R/cpu_phases_again.json
gpu_tests 150
call_end
