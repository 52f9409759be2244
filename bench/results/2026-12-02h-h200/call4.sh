#!/bin/bash
# Twenty-third session, call 4: is call 3's slowdown with the wait prefetch the feature or the
# host? MLA's spilled table (shares 0, 0.6, 1) alternating WRITESCOPE_CPU_WAIT_PREFETCH_KB 1024 /
# 0 / 1 (its reservations with almost no prefetch) / 1024 / 0.
source bench/results/run-helper.sh
call_begin 185
for kb in 1024 0 1 1024 0; do
  export WRITESCOPE_CPU_WAIT_PREFETCH_KB=$kb
  hybrid_table hyb-kb$kb-$((++i)) 35 --shapes mla --shares 0,0.6,1 --staging-mib 2048
done
call_end
