#!/bin/bash
# Nineteenth session, call 1: the GPU tests on the tree after the eighteenth session (the BF16
# kernel's L1 prefetch, WS_QK_PF added off); two A/Bs of the AMX kernel against copies of this
# tree's csrc (tmp_ab_csrc/, removed afterwards): qkpf = WS_QK_PF=1 (the C layout's Q.K
# prefetches its next tile step's K lines into L1), pft0 = its L2 prefetch cursor into L1
# (WS_PF_HINT _MM_HINT_T0, as the BF16 kernel since 27f65cd); ratio = this tree / the copy,
# so < 1 means the copy is faster. Then issue 8's table and issue 9's hybrid with P.V's prefetch.
source bench/results/run-helper.sh
call_begin 570
gpu_tests 150
run ab-qkpf 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/qkpf --isa amx --reps 11 --json $R/cpu_ab_qkpf.json
run ab-pft0 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/pft0 --isa amx --reps 11 --json $R/cpu_ab_pft0.json
run ab-qkpf-again 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/qkpf --isa amx --reps 11 --json $R/cpu_ab_qkpf_again.json
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
call_end
