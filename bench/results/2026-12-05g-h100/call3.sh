#!/bin/bash
# 2026-12-05, fifty-sixth session, call 3 (after the whole GPU suite passed on 115dc54): the
# targets' rows on the current tree. Issue 8's table (`bench.cpu_attention`), issue 6's
# experts-on-GPU rows against transfer and cpu (DeepSeek-V2-Lite 4 x 128K at 38 GiB, Qwen3-30B-A3B
# 2 x 128K at 68 GiB, two rounds each), and where a spilled eager step's host time goes (Qwen3
# 4 x 8K, experts on the GPU, 128 GPU blocks: step_profile --cprofile), for the CUDA graphs of
# spilled steps not yet built. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 50
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
dsv2_row dsv2 170 --policies writescope,transfer,cpu
qwen3_row q2-128k 200 --policies writescope,transfer,cpu
host_profile q4-8k-spill 90 4 8k gpu 68GiB --num-gpu-blocks 128 --warmup 3 --steps 3
call_end
