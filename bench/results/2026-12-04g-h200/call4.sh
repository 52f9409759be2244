#!/bin/bash
# Forty-second session, call 4: the timer slack on the longer batch-1 chain, Qwen3-30B-A3B 1 x 1K
# with the experts on the CPU (32 GiB, writescope; 48 hand-offs a step), two alternating pairs of
# processes.
source bench/results/run-helper.sh
call_begin 400
P=bench/profiles/h200.json
for k in 1 2; do
  for s in 1000 default; do
    run q1-1k-$s-$k 95 env WRITESCOPE_TIMER_SLACK_NS=$s python -m writescope bench \
      --model qwen3-30b-a3b --random-weights --profile $P --vram-budget 32GiB --experts cpu \
      --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 --prefill synthetic \
      --no-progress --policies writescope --batch 1 --context-lengths 1k --out $R/q1-1k-$s-$k
  done
done
call_end
