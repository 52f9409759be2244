#!/bin/bash
# 2026-12-01, tenth session, call 2: GPU tests after the host-time cuts (direct Triton launches
# through the kept compiled kernel, attention/launch.py; staging runs as driver copies through
# ctypes; raw stream handles); where a 4 x 32K step's host time goes now; DeepSeek-V2-Lite with
# experts on the GPU at 4 x 32K (writescope, transfer; writescope again with the old launch and
# copy paths, WRITESCOPE_FAST_LAUNCH=0 WRITESCOPE_DRIVER_COPY=0, and pipelined) and 4 x 128K
# with ~8 GB of KV in HBM (writescope, transfer).
source bench/results/run-helper.sh
call_begin 540
gpu_tests 130
calibrate_profile
SP="python -m writescope.bench.step_profile --model deepseek-v2-lite --random-weights --batch 4 --prefill synthetic --experts gpu --warmup 4 --steps 2 --cprofile 4 --top 40 --profile $P"
run prof32-plain 45 $SP --context 32768 --vram-budget 48GiB --num-gpu-blocks 128 --json $R/step_profile_32k_plain.json
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 24 --profile $P --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k --prefill synthetic --warmup-length 4k --no-progress"
run d32 100 $B --policies writescope,transfer --out $R/d32
run d32-old 60 env WRITESCOPE_FAST_LAUNCH=0 WRITESCOPE_DRIVER_COPY=0 $B --policies writescope --out $R/d32-old
run d32-pipe 60 env WRITESCOPE_PIPELINE=1 $B --policies writescope --out $R/d32-pipe
run d128 100 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 38GiB --experts gpu --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 16 --prefill synthetic --no-progress \
  --policies writescope,transfer --out $R/d128
call_end
