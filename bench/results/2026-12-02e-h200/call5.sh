#!/bin/bash
# Twentieth session, call 5, on the final kernel (the T layout's parity P.V moved into helper
# functions out of amx_item, after call 4 read this tree's C layout 0.86-1.02x 1aa76ca's on a
# very noisy host): the CPU attention tests on the real AMX unit, the GPU tests, the A/B against
# 1aa76ca on both layouts (C: the control), issue 8's table, issue 9's six hybrid shapes.
source bench/results/run-helper.sh
call_begin 480
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
gpu_tests 170
run ab-base 60 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --layouts C,T --isa amx --reps 11 --json $R/cpu_ab_base.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
