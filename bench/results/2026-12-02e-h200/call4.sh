#!/bin/bash
# Twentieth session, call 4, on the session's kernel (the T layout's P.V in place, WS_PV_PAR on):
# the CPU attention tests on the real AMX unit and the GPU tests; the T layout against 1aa76ca's
# kernel (tmp_ab_csrc/base) on both layouts, and WS_QKG_PF=1 (the T layout's Q.K L1 prefetch);
# issue 8's table with the T-layout column; issue 9's six hybrid shapes.
source bench/results/run-helper.sh
call_begin 560
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
gpu_tests 170
run ab-base 60 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --layouts C,T --isa amx --reps 7 --json $R/cpu_ab_base.json
run ab-qkgpf 50 python -m writescope.bench.cpu_ab --defines WS_QKG_PF=1 --layouts T --isa amx --reps 9 --json $R/cpu_ab_qkgpf.json
run cpu-attn 80 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
