#!/bin/bash
# Twenty-eighth session, call 4: the GPU tests of the fused RMSNorm (one Triton kernel per norm
# instead of eight torch kernels: ~1,500 of a Qwen3 step's ~4,500 kernels were norms' in
# call 3) and of the fused MoE's narrower gate/up programs (16 rows instead of 64 when a step
# routes few pairs: 192 programs on 132 SMs read at ~1.6 TB/s in call 3) and of the half-split
# rotation in one Triton kernel (nine torch kernels, twice a layer, before), the Qwen3-30B-A3B
# 2 x 32K step's time and device time again (calls 1 and 3: 19.3-19.6 ms, 14.7 ms of kernels).
# (The device time left after three refused starts allows no more.)
source bench/results/run-helper.sh
call_begin 235
gpu_tests 175
P=bench/profiles/h200.json
host_profile q2-32k-gpu 45 2 32k gpu 68GiB --top 40
call_end
