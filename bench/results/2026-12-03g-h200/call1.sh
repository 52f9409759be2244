#!/bin/bash
# Thirty-second session, call 1: placement's CPU margin. DeepSeek-V2-Lite 4 x 128K with the experts
# on the GPU (38 GiB): writescope at the default PLACEMENT_CPU_MARGIN (1.4), static, and writescope
# at 1.2 and 1.0, two rounds of alternating order (margin_ab). Then Qwen3-30B-A3B 2 x 128K (68 GiB):
# writescope at 1.4 and 1.2, and static, one round. The open question (thirty-first session): on a
# fast host static's C share (0.576) beat writescope's 0.514 by 14% on DeepSeek.
source bench/results/run-helper.sh
call_begin 480
P=bench/profiles/h200.json
margin_ab dsv2-margin 280
run qwen3-margin 150 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 68GiB --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress \
  --policies writescope,static,writescope@placement_cpu_margin=1.2 --out $R/qwen3-margin
call_end
