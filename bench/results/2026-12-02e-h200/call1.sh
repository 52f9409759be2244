#!/bin/bash
# Twentieth session, call 1: the restructured token-major Q.K loop (b68f6ed) on the real AMX
# unit -- the CPU attention tests, then bench.cpu_ab against 1aa76ca's csrc (tmp_ab_csrc/base,
# the last kernel measured on the H200; ratio = this tree / 1aa76ca) -- then the three unmeasured
# knobs as builds of this tree (WS_QK_PIPE=1, WS_QK_PF=2, WS_PV_PF=2; ratio = default / knob),
# the extended l2_to_l1 microbench (products alone, A rotated over three tiles, closing clock),
# issue 8's table and issue 9's six hybrid shapes in one call.
source bench/results/run-helper.sh
call_begin 575
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
run ab-base 50 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --isa amx --reps 11 --json $R/cpu_ab_base.json
run ab-knobs 110 python -m writescope.bench.cpu_ab --defines "WS_QK_PIPE=1;WS_QK_PF=2;WS_PV_PF=2" --isa amx --reps 11 --json $R/cpu_ab_knobs.json
run l2l1-build 20 gcc -O2 -pthread -mamx-tile -mamx-bf16 -mavx512f bench/microbench/l2_to_l1.c -o $R/l2l1
run l2l1 60 $R/l2l1
rm -f $R/l2l1
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
