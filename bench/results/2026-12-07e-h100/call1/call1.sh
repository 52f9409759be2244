#!/bin/bash
# Seventy-seventh session, call 1: is issue 8's slow first calls new memory? bench.fresh_pages
# (a new buffer read pass by pass, back to back and after an idle wait, the kernel on a new pool
# set by set, against a buffer read before), then issue 8's table alternating the bench's old
# pools (a new pool per shape, --pool-memory new) and the arena (every pool carved from one
# buffer read until it keeps pace with the probe's), twice each, then fresh_pages again.
# Carry .whl. CALL_S=330.
source bench/results/run-helper.sh
call_begin ${CALL_S:-330}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag > $R/thp.txt 2>&1
fresh() { run fresh-$1 40 python -m writescope.bench.fresh_pages --gib 2 --passes 12 --sleep 5 --kernel-calls 16 --json $R/fresh-$1.json; cat $R/fresh-$1.log; }
table() { run cpu-attn-$1 75 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --pool-memory $2 --json $R/cpu_attention-$1.json; grep -v "^\[" $R/cpu-attn-$1.log | tail -14; }
fresh 1
table new1 new
table arena1 arena
table new2 new
table arena2 arena
fresh 2
call_end
