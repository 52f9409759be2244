#!/bin/bash
# Eighteenth session, call 2: how the host's cores read DRAM and share their tile units.
# (1) bench/microbench/read_scaling.c: DRAM latency alone and beside streaming threads; read
#     GB/s with 1..16 threads, plain loads and software prefetch; lines each core keeps in flight.
# (2) bench/microbench/amx_siblings.c again, the pair sweep three times (call 1 saw vCPU 0's tile
#     products slow 1.9-2.4x beside vCPUs 4-11 only, its FMA beside none).
# (3) The kernel's L2-resident work per group with 1, 2, 4, 8 and 16 threads (bench.cpu_phases).
source bench/results/run-helper.sh
call_begin 300
run build 30 bash -c "gcc -O2 -pthread -mavx512f bench/microbench/read_scaling.c -o /tmp/rs && \
  gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f bench/microbench/amx_siblings.c -o /tmp/sib"
run read-scaling 90 /tmp/rs
run siblings 60 /tmp/sib
run l2-threads 60 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 1,2,4,8,16 \
  --pools 0.5 --prefetch-blocks 0 --seconds 1.0 --json $R/l2_threads.json
call_end
