#!/bin/bash
# Twenty-seventh session, call 5 (the last ~4 device minutes): placement's CPU margin. In call 4
# writescope placed 0.506 of DeepSeek-V2-Lite 4 x 128K's spill in C (PLACEMENT_CPU_MARGIN 1.4)
# where its own step plan wanted 0.547 and static placed 0.566, and ran 4% behind static. A/B:
# the default margin (with static beside it), then margin 1.0, on the committed profile.
source bench/results/run-helper.sh
call_begin 165
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --vram-budget 38GiB --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run m14 90 python -m writescope bench --model deepseek-v2-lite $G --policies writescope,static --out $R/m14
run m10 60 env WRITESCOPE_PLACEMENT_CPU_MARGIN=1.0 python -m writescope bench --model deepseek-v2-lite $G --policies writescope --out $R/m10
call_end
