#!/bin/bash
# Sixteenth session, call 1. The AMX kernel's softmax is cheaper (four max chains, two sum
# chains, a degree-4 exp2 with VSCALEFPS, two slots per exp at <= 8 rows: on the dev VM, GQA's
# L2-resident time per 32-token group 494 -> 398 ns, MLA 1543 -> 1484 ns). (1) Where one core's
# time goes on this host, alone and with all 16 cores streaming, L2-resident vs past the L3
# (`bench.cpu_phases`, new); (2) the CPU attention bench against every way of reading, as in the
# fifteenth session's call 3; (3) the hybrid rows of both families; (4) the GPU tests.
source bench/results/run-helper.sh
call_begin 560
run cpu-phases 150 python -m writescope.bench.cpu_phases --threads 1,16 --pools 0.5,1536 \
  --prefetch-blocks 0,1,2 --seconds 1.5 --json $R/cpu_phases.json
run cpu-attn 120 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
gpu_tests 160
call_end
