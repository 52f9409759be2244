#!/bin/bash
# Twentieth session, call 2: where one core's MLA time goes. bench/microbench/amx_mla_pass.c
# (new) times the kernel's Q.K and P.V schedules over 12 groups in L2 with one part at a time
# taken out or changed, on one vCPU and on all; bench.cpu_phases gives the real kernel's phases
# on the same host (1aa76ca's kernel, restored after call 1's A/B found the restructured loop
# 4-5% slower); the microbench runs twice, before and after.
source bench/results/run-helper.sh
call_begin 330
run mlapass-build 20 gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f -mavx512bw bench/microbench/amx_mla_pass.c -o $R/mlapass
run mlapass 60 $R/mlapass
run phases 100 python -m writescope.bench.cpu_phases --shapes mla-16/1/576 --threads 1,16 --pools 0.5,1536 \
  --prefetch-blocks 1 --seconds 1.0 --json $R/cpu_phases.json
run mlapass-again 60 $R/mlapass
rm -f $R/mlapass
run l2l1-build 20 gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f bench/microbench/l2_to_l1.c -o $R/l2l1
run l2l1 40 $R/l2l1
rm -f $R/l2l1
call_end
