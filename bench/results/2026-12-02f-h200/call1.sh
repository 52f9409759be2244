#!/bin/bash
# Twenty-first session, call 1: the committed kernel (the T layout's parity P.V as amx_item_t<PAR>,
# so far run on emulated tiles only) on the real AMX unit, the GPU tests (the copy streams'
# reshaped staging, 1-3 streams), the A/B against 1aa76ca on both layouts, MLA's hybrid rows with
# one and two copy streams side by side, GQA's hybrid rows, issue 8's table.
source bench/results/run-helper.sh
call_begin 570
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py
gpu_tests 170
run ab-base 60 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --layouts C,T --isa amx --reps 11 --json $R/cpu_ab_base.json
run hybrid-mla-s1 55 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-s1.json
run hybrid-mla-s2 55 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 WRITESCOPE_COPY_STREAMS=2 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-s2.json
run hybrid-gqa-s2 55 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 WRITESCOPE_COPY_STREAMS=2 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-s2.json
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
