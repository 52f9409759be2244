#!/bin/bash
# Thirty-sixth session, call 3 (the session's last device time): the prefetching GEMV
# (layers/gemv.py gemv_prefetch, WRITESCOPE_GEMV=prefetch: each program loads its weight tile
# before waiting for the kernel before) -- its tests and the PDL test; the 32K steps with it and
# without, A/B; issue 6's Qwen3 32K row with it; the full GPU suite with it; issue 9's spilled
# hybrid table (PDL on) in the time left.
source bench/results/run-helper.sh
call_begin 520
run unit-tests 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -q -p no:cacheprovider --tb=short -rf tests/test_gemv.py tests/test_pdl.py
P=bench/profiles/h200.json
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 4 --warmup 4 --cprofile 0"
run q2-32k-pre 30 env WRITESCOPE_GEMV=prefetch $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-pre.json
run q2-32k 30 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k.json
run d4-32k-pre 30 env WRITESCOPE_GEMV=prefetch $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-pre.json
run d4-32k 30 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k.json
run m2-32k-pre 30 env WRITESCOPE_GEMV=prefetch $SP --model mixtral-8x7b --batch 2 --context 32k --vram-budget 98GiB --json $R/m2-32k-pre.json
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static --context-lengths 32k"
run qwen3-32k-pre 50 env WRITESCOPE_GEMV=prefetch python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 $G --out $R/qwen3-32k-pre
run gpu-tests-pre 200 env WRITESCOPE_GEMV=prefetch WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
hybrid_table hyb 140
call_end
