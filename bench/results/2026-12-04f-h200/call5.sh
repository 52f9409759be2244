#!/bin/bash
# Forty-first session, call 5: issue 6's transformers peer on the current engine (DeepSeek-V2-Lite
# 1 x 8K and 1 x 32K, experts on the CPU, 32 GiB, the peer's weights offloaded; last run in the
# tenth session), the GPU tests of the attention benches (whose summary changed after call 3), and issue 9's
# MLA rows once more.
source bench/results/run-helper.sh
call_begin 325
calibrate_profile 30
run peer 180 python -m writescope bench --model deepseek-v2-lite --random-weights \
  --profile $P --vram-budget 32GiB --experts cpu --batch 1 \
  --context-lengths 8k,32k --decode-steps 8 --policies writescope --peer transformers \
  --peer-offload-weights --no-progress --out $R/peer
run gpu-tests-bench 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_gpu_attention.py tests/test_bench.py
hybrid_table hyb-mla 45 --shapes mla --shares 0,0.55,0.575,0.6,0.625,0.65,1
call_end
