#!/bin/bash
# Twenty-fourth session, call 1: the CPU team's items per member (WRITESCOPE_CPU_ATTN_ITEMS_PER_THREAD,
# default 8; more items, a shorter tail) on issue 9's spilled table, alternated: MLA (shares 0,
# 0.6, 1) at 8 / 16 / 32 twice, GQA at 8 / 16; then the GPU tests (the kernel plans now carry an
# instance's thread count).
source bench/results/run-helper.sh
call_begin 540
for n in 8 16 32 8 16 32; do
  export WRITESCOPE_CPU_ATTN_ITEMS_PER_THREAD=$n
  hybrid_table mla-it$n-$((++i)) 40 --shapes mla --shares 0,0.6,1 --staging-mib 2048
done
for n in 8 16; do
  export WRITESCOPE_CPU_ATTN_ITEMS_PER_THREAD=$n
  hybrid_table gqa-it$n-$((++i)) 40 --shapes gqa --shares 0,0.6,1 --staging-mib 2048
done
unset WRITESCOPE_CPU_ATTN_ITEMS_PER_THREAD
gpu_tests 170
call_end
