#!/bin/bash
# Session 9 (2026-12-01), call 1 (planned 2026-12-01, seventh session, which had no device time): GPU tests
# at HEAD (untested on the GPU: the two-region native CPU side d5f6c19, host-wait fallback, MLA
# per-head prefill, h2d index copies, the one-pass merge kernel); resident decode with the new
# merge and 4-64-block chunks (the merge timed alone); MLA prefill per head against absorbed;
# the AMX kernel's prefetch distance; then DeepSeek-V2-Lite 4 x 32K, all five policies.
# Copy into bench/results/<date>-h200/ and run from the repository root:
#   bash bench/results/<date>-h200/call1.sh
source bench/results/run-helper.sh
call_begin 560
run gpu-tests 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run resident 70 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
run prefill 40 python -m writescope.bench.prefill --shapes mla-16/1/576 --contexts 0,28K,124K
run cpu-attn-pf 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --sizes 1x256K,8x32K --prefetch-blocks 1,2,4 --json $R/cpu_attention-pf.json
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 24 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --no-progress"
run dsv2-32k 260 $B --policies writescope,static,transfer,cpu,migrate --out $R/dsv2-32k
call_end
