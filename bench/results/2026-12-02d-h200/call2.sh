#!/bin/bash
# Nineteenth session, call 2: the CPU attention tests on the real AMX unit (the word shuffles
# now VPERMB / VPERMT2B, WS_VBMI=1; the token-major Q.K's L1 prefetch on, WS_QK_PF=1); A/Bs of
# this tree against copies with one of them off (tmp_ab_csrc/novbmi, tmp_ab_csrc/noqkpf; ratio =
# this tree / the copy, > 1: this tree faster); issue 8's table and issue 9's hybrid on it.
source bench/results/run-helper.sh
call_begin 560
run cpu-tests 120 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
run ab-vbmi 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/novbmi --isa amx --reps 11 --json $R/cpu_ab_vbmi.json
run ab-noqkpf 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/noqkpf --isa amx --reps 11 --json $R/cpu_ab_qkpf3.json
run ab-vbmi-again 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/novbmi --isa amx --reps 11 --json $R/cpu_ab_vbmi_again.json
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
