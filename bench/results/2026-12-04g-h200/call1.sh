#!/bin/bash
# Forty-second session, call 1: would a C layout that lets MLA's two products read the KV tiles in
# place (bench/microbench/amx_mla_layout.cpp: "dpairs", per 16 tokens [R/2][16][2]) attend faster
# than the pair layout and its token-major copies (the kernel's schedule)? The microbenchmark, with
# its KV in L2 and streamed from DRAM, one vCPU and all; then the kernel itself on MLA (C and T
# layouts, the KV rotated) for the host's figures beside it.
source bench/results/run-helper.sh
call_begin 300
run build 60 g++ -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f -mavx512bw -mavx512vl -mavx512dq \
  -mavx512bf16 -mfma bench/microbench/amx_mla_layout.cpp -o $R/mlalayout
run mlalayout 150 $R/mlalayout
rm -f $R/mlalayout
run cpu-attn-mla 90 python -m writescope.bench.cpu_attention --shapes mla --reps 3 --torch-reps 0 \
  --no-variants --isa profile --profile bench/profiles/h200.json --json $R/cpu_attention_mla.json
call_end
