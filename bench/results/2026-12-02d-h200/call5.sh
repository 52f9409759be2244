#!/bin/bash
# Nineteenth session, call 5 (the last device minutes): bench/microbench/l2_to_l1.c, how many
# bytes a cycle one core moves from L1 and from L2 into vector registers and tiles in the MLA
# kernel's access patterns, alone and with every vCPU doing the same.
source bench/results/run-helper.sh
call_begin 120
run l2l1-build 30 gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f bench/microbench/l2_to_l1.c -o $R/l2l1
run l2l1 60 $R/l2l1
rm -f $R/l2l1
call_end
