#!/bin/bash
# Planned second call (written in the forty-eighth session, which had no device machine):
# what automatic prefix caching saves the next turn of a long conversation on the H200 --
# Qwen3-30B-A3B at full size (random weights), routed experts on the CPU, 32 GiB VRAM budget:
# a first turn of 8K / 32K tokens, then that prompt + its answer + 64 new tokens, timed to the
# first token with prefix caching off and on (the dev VM's 2-layer figures are in
# bench/results/2026-12-05-devvm/). (The GPU suite of call 1 has the prefix cache's CUDA
# parity test, tests/test_gpu_e2e.py::test_cuda_prefix_cache_hits_match_transformers.)
source bench/results/run-helper.sh
call_begin 450
run prefix-qwen3 420 python -m writescope.bench.prefix_cache --model qwen3-30b-a3b \
  --random-weights --vram-budget 32GiB --experts cpu --contexts 8192 32768 --reps 1 \
  --max-num-batched-tokens 16384 --json $R/prefix_cache-qwen3.json
call_end
