#!/bin/bash
# Ninth session (2026-12-01c), call 5: the transformers peer with its weights offloaded by accelerate
# (call 4: with every weight on the GPU it ran out of memory under the 32 GiB budget:
# 31.3 GiB of weights allocated), DeepSeek-V2-Lite 1 x 8K, experts on the CPU, beside writescope.
# Run from the repository root: bash bench/results/2026-12-01c-h200/call5.sh
source bench/results/run-helper.sh
call_begin 200
python -c "import accelerate; print('accelerate', accelerate.__version__)" > $R/accelerate.txt 2>&1
cat $R/accelerate.txt
run peer 175 env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model deepseek-v2-lite \
  --random-weights --profile bench/profiles/h200.json --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k --decode-steps 8 --policies writescope --peer transformers \
  --peer-offload-weights --no-progress --out $R/peer
call_end
