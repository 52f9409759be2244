#!/bin/bash
# Forty-second session, call 3: the GPU suite on the session's package (the waiting threads'
# timer slack), then three more alternating pairs of the batch-1 row of call 2 (DeepSeek-V2-Lite
# 1 x 8K, experts on the CPU, 32 GiB, writescope), Linux's default slack first this time.
source bench/results/run-helper.sh
call_begin 575
gpu_tests 300
P=bench/profiles/h200.json
for k in 3 4 5; do
  for s in default 1000; do
    run d1-8k-$s-$k 60 env WRITESCOPE_TIMER_SLACK_NS=$s python -m writescope bench \
      --model deepseek-v2-lite --random-weights --profile $P --vram-budget 32GiB --experts cpu \
      --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 24 --prefill synthetic \
      --no-progress --policies writescope --batch 1 --context-lengths 8k --out $R/d1-8k-$s-$k
  done
done
call_end
