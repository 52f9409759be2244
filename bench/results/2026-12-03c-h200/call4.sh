#!/bin/bash
# Twenty-eighth session, call 4: the GPU tests of the fused RMSNorm (one Triton kernel per norm
# instead of eight torch kernels: ~1,500 of a Qwen3 step's ~2,500 kernels were norms' in
# call 3) and of the fused MoE's narrower gate/up programs (16 rows instead of 64 when a step
# routes few pairs: 192 programs on 132 SMs read at ~1.6 TB/s in call 3) and of the half-split
# rotation in one Triton kernel (nine torch kernels, twice a layer, before), the Qwen3-30B-A3B
# 2 x 32K step's device time again, then issue 6's experts-on-GPU
# row of Qwen3 at 32K (68 GiB: all KV in G, every decode step resident), all five
# policies (the rows before these changes: calls 1 and 3, and the twenty-seventh session's).
source bench/results/run-helper.sh
call_begin 300
gpu_tests 175
P=bench/profiles/h200.json
host_profile q2-32k-gpu 45 2 32k gpu 68GiB --top 40
Q="--model qwen3-30b-a3b --random-weights --profile $P --vram-budget 68GiB --experts gpu --batch 2 --context-lengths 32k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress"
run qwen3-gpu-short 80 python -m writescope bench $Q --policies writescope,transfer,cpu,static,migrate --out $R/qwen3-gpu-short
call_end
