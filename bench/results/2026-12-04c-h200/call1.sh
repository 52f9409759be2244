#!/bin/bash
# Thirty-eighth session, call 1: the calibration with the attention kernels timed as a planned
# step runs them and a CUDA graph's kernel cost (graph_launch_s); the new GPU test; issue 6's
# Mixtral-8x7B 2 x 32K row with its G pool held at 1,017 blocks (8 streamed), writescope and
# transfer in two rounds of alternating order, each row recording its threads' context switches
# and a Python probe; DeepSeek-V2-Lite 4 x 32K (all in HBM: the planner's predictions of
# overlapped steps); DeepSeek-V2-Lite 4 x 128K writescope/transfer, then writescope with
# OMP_NUM_THREADS=2 (the launching thread's OpenMP team kept small, so that libgomp does not
# throttle the CPU attention team's spin).
source bench/results/run-helper.sh
call_begin 570
calibrate_profile 60
grep -E "device attention|graph_launch|launch_s" $R/calibrate.log
run gpu-test-planned 60 python -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/test_gpu_attention.py -k planned_attend
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run mixtral-32k 110 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 --num-gpu-blocks 1017 $G --policies writescope,transfer --rounds 2 --context-lengths 32k --out $R/mixtral-32k
run dsv2-32k 60 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 $G --policies writescope,transfer --context-lengths 32k --out $R/dsv2-32k
dsv2_row dsv2-128k 80 --policies writescope,transfer --decode-steps 12 --rounds 1
OMP_NUM_THREADS=2 dsv2_row dsv2-128k-omp2 60 --policies writescope --decode-steps 12 --rounds 1
call_end
