#!/bin/bash
# Eighteenth session, call 1.
# (1) bench/microbench/amx_siblings.c: the clock under AMX load (one vCPU, all 16) and whether
#     any two vCPUs share a core (one tile unit, one set of ports): the L2-resident MLA work per
#     group took twice as long with 16 threads as with one (seventeenth session, call 1).
# (2) Sparse software prefetch (-DWS_PF_EVERY=n: one line in n, the rest left to the L2
#     streamer, whose prefetches hold no L1 miss buffer) against the default, side by side and
#     in both orders, MLA and GQA from DRAM at 16 threads.
source bench/results/run-helper.sh
call_begin 420
run siblings-build 30 gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f bench/microbench/amx_siblings.c -o /tmp/sib
run siblings 60 /tmp/sib
run pf-every 150 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 16 \
  --pools 1536 --prefetch-blocks 1,2 --seconds 1.0 --defines ";WS_PF_EVERY=2;WS_PF_EVERY=4" --json $R/pf_every.json
run pf-every-again 120 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 16 \
  --pools 1536 --prefetch-blocks 1,2 --seconds 1.0 --defines "WS_PF_EVERY=4;WS_PF_EVERY=2;" --json $R/pf_every_again.json
run l2-work 60 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 1,16 \
  --pools 0.5 --prefetch-blocks 0 --seconds 1.0 --json $R/l2_work.json
call_end
