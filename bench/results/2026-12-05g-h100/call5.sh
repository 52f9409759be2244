#!/bin/bash
# 2026-12-05, fifty-sixth session, call 5: GQA's 1 x 256K row lags its 8 x 32K row by ~16% on the
# same builds (call 4: 131.6 against 155.9 GB/s; MLA, one KV head, does not). In the head-major
# C layout an item reads one head's 32 KB slice of each of its blocks, and the items taken at
# once were one head's chunks (a single sequence's heads come one after the other): members
# read slices of many blocks instead of whole blocks. -DWS_ITEM_ORDER=1 orders each sequence's
# items chunk by chunk, the chunk's heads together (also with 16 items a member).
source bench/results/run-helper.sh
call_begin ${CALL_S:-280}
run ab-order 200 python -m writescope.bench.cpu_ab \
  --defines "WS_ITEM_ORDER=1;WS_ITEM_ORDER=1,WS_ITEMS_PER_THREAD=16" \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K,64x4K --reps 9 --json $R/ab-order.json
cat $R/ab-order.log
call_end
