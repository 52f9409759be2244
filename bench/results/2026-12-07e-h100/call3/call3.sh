#!/bin/bash
# Seventy-seventh session, call 3 (the machine of call 2, still warm): WS_PF_SPREAD=1 against the
# default build again at the default prefetch distance (2), twice with 15 rounds, since call 2's
# one run favoured it in 5 of 6 shapes by 2-6%. Carry .whl. CALL_S=150.
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
for i in 1 2; do
  run ab-spread-$i 65 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=1" --reps 15 --json $R/ab-spread-$i.json
  grep -v "^\[" $R/ab-spread-$i.log | tail -8
done
call_end
