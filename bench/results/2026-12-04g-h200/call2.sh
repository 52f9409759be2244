#!/bin/bash
# Forty-second session, call 2: the waiting threads' timer slack (WRITESCOPE_TIMER_SLACK_NS, new:
# 1000 ns by default, "default" = Linux's 50 us). bench.naps alternates the two settings: a 20 us
# nap's real length and one layer's CPU attention round trip in the decode chain (MLA and GQA).
# Then DeepSeek-V2-Lite 1 x 8K with the experts on the CPU (32 GiB; the batch-1 serial chain of
# 26 GPU -> CPU experts -> GPU hand-offs a step), writescope alone, one process per setting,
# alternating, twice each.
source bench/results/run-helper.sh
call_begin 560
run naps 120 python -m writescope.bench.naps --rounds 6 --json $R/naps.json
P=bench/profiles/h200.json
for k in 1 2; do
  for s in 1000 default; do
    run d1-8k-$s-$k 90 env WRITESCOPE_TIMER_SLACK_NS=$s python -m writescope bench \
      --model deepseek-v2-lite --random-weights --profile $P --vram-budget 32GiB --experts cpu \
      --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 24 --prefill synthetic \
      --no-progress --policies writescope --batch 1 --context-lengths 8k --out $R/d1-8k-$s-$k
  done
done
call_end
