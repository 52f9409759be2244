#!/bin/bash
# Ninth session (2026-12-01c), call 4: GPU tests after call 3's two fixes (the peer's allocator cap
# on an indexed device, with a new GPU test of the peer; the CPU-experts test now expecting
# seconds from every path); the transformers peer again (DeepSeek-V2-Lite 1 x 8K, experts on the
# CPU, 32 GiB); DeepSeek-V2-Lite 4 x 128K with experts on the GPU (38 GiB), writescope plain
# against pipelined steps (WRITESCOPE_PIPELINE=1) on the same machine.
# Run from the repository root: bash bench/results/2026-12-01c-h200/call4.sh
source bench/results/run-helper.sh
call_begin 430
run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run peer 170 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model deepseek-v2-lite \
  --random-weights --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k --decode-steps 8 --policies writescope --peer transformers --no-progress \
  --out $R/peer
B="python -m writescope bench --model deepseek-v2-lite --random-weights --profile bench/profiles/h200.json --vram-budget 38GiB --experts gpu --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 16 --prefill synthetic --no-progress --policies writescope"
run dsv2-plain 60 $B --out $R/dsv2-plain
run dsv2-pipe 60 env WRITESCOPE_PIPELINE=1 $B --out $R/dsv2-pipe
call_end
