#!/bin/bash
# 2026-12-05, fifty-sixth session, call 4: why issue 8's 1 x 256K rows lag (call 3: GQA 84%,
# MLA 79% of the vector read, against 86-108% at 8 x 32K and 64 x 4K). Is it the tail -- team
# members out of items while the last ones run, and one group's merge waiting for all of them?
# The kernel with 2, 4 and 32 items a member against the default 8 (-DWS_ITEMS_PER_THREAD,
# bench.cpu_ab: same pools, builds alternating call by call), then issue 8's table again.
source bench/results/run-helper.sh
call_begin ${CALL_S:-380}
run ab-items 200 python -m writescope.bench.cpu_ab \
  --defines "WS_ITEMS_PER_THREAD=32;WS_ITEMS_PER_THREAD=4;WS_ITEMS_PER_THREAD=2" \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K,64x4K --reps 7 --json $R/ab-items.json
cat $R/ab-items.log
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
