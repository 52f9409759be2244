#!/bin/bash
# 2026-12-05, fifty-sixth session, call 6: the chunk-by-chunk item order as the default
# (WS_ITEM_ORDER 1) against the old head-by-head order, on another host (call 5: GQA 1 x 256K
# 1.035x, the other rows within 2%; MLA has one KV head, so its order is unchanged: its ratios
# are the noise).
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
run ab-order0 120 python -m writescope.bench.cpu_ab --defines "WS_ITEM_ORDER=0" \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K,64x4K --reps 9 --json $R/ab-order0.json
cat $R/ab-order0.log
call_end
