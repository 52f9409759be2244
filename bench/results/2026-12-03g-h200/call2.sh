#!/bin/bash
# Thirty-second session, call 2: decode attention's self-merge, the router's softmax/top-k and
# DeepSeek-V2's interleaved rotation are one Triton kernel each on CUDA (attention/selfmerge.py,
# layers/routing.py, layers/rotary.py), and GQA's q/k/v projections one GEMM (models/gqa.py):
# ~25-40 fewer kernels a layer. The GPU suite; then where a decode step's time goes
# (bench.step_profile) with them and without (WRITESCOPE_FUSED_SELF_MERGE=0
# WRITESCOPE_FUSED_ROUTER=0 WRITESCOPE_FUSED_ROPE=0 WRITESCOPE_FUSED_QKV=0; ROPE=0 also turns off
# the half-split rotation kernel of the twenty-eighth session), alternating:
# Qwen3-30B-A3B 2 x 32K (68 GiB, all KV in HBM: one CUDA graph a step) and DeepSeek-V2-Lite
# 4 x 32K (38 GiB); then issue 6's DeepSeek-V2-Lite 4 x 128K row, writescope and transfer, two
# rounds.
source bench/results/run-helper.sh
call_begin 560
gpu_tests 185
P=bench/profiles/h200.json
OFF="WRITESCOPE_FUSED_SELF_MERGE=0 WRITESCOPE_FUSED_ROUTER=0 WRITESCOPE_FUSED_ROPE=0 WRITESCOPE_FUSED_QKV=0"
SP="python -m writescope.bench.step_profile --random-weights --profile $P --prefill synthetic --experts gpu --top 40 --steps 3 --warmup 3 --cprofile 0"
run q2-32k-fused 45 $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-fused.json
run q2-32k-torch 45 env $OFF $SP --model qwen3-30b-a3b --batch 2 --context 32k --vram-budget 68GiB --json $R/q2-32k-torch.json
run d4-32k-fused 45 $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-fused.json
run d4-32k-torch 45 env $OFF $SP --model deepseek-v2-lite --batch 4 --context 32k --vram-budget 38GiB --json $R/d4-32k-torch.json
dsv2_row dsv2-128k 150 --policies writescope,transfer --decode-steps 12
call_end
