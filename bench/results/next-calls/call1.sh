#!/bin/bash
# Next session, call 1 (planned 2026-12-01, eighth session): issue 6's experts-on-CPU grid at one
# source, all five policies in one run, the profile calibrated in the same call (the machine's
# CPU read measured 128.5 and 87.3 GB/s in two calls of 2026-12-01b): Qwen3-30B-A3B 4 x 64K
# and 4 x 128K (both spill more KV than the experts read? 64K: ~12 GB vs 13 GB), then
# DeepSeek-V2-Lite 8 x 128K (1M tokens). Copy into bench/results/<date>-h200/ and run from the
# repository root: bash bench/results/<date>-h200/call1.sh
source bench/results/run-helper.sh
call_begin 570
run calibrate 40 python -m writescope calibrate --out $R/h200-profile.json
P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
C="--random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static,migrate"
run qwen3 300 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model qwen3-30b-a3b \
  --batch 4 --context-lengths 64k,128k $C --out $R/qwen3
run dsv2-1m 200 env WRITESCOPE_STACKS_EVERY_S=120 python -m writescope bench --model deepseek-v2-lite \
  --batch 8 --context-lengths 128k $C --out $R/dsv2-1m
call_end
