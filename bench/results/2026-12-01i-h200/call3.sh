#!/bin/bash
# Fifteenth session, call 3. Calls 1-2: torch's sum read the probe array at up to 108 GB/s and
# prefetched AMX tile loads at up to 130, where the CPU attention bench's vector-sum probe read
# 79-93: its %-of-read figures were against a weak denominator. (1) the CPU attention bench now
# reads the array every way beside each shape and pairs each call with one pass of every way
# (`best_read_bw_gbps`, `paired_frac_of_best_read_bw`); (2) the read probes with 16 and 14
# threads interleaved within each round (call 2 ran them one after the other: 16 threads' tile
# loads read 124 GB/s, 14 threads' 81); (3) the MLA hybrid rows at 16 CPU threads beside 14;
# (4) the GPU tests on this tree.
source bench/results/run-helper.sh
call_begin 400
run cpu-attn 120 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 1,2 --json $R/cpu_attention.json
run read-probes 90 python -m writescope.bench.read_probes --threads 16,14 --rounds 3 --json $R/read_probes.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run hybrid-mla-14 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 14 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-14.json
gpu_tests 160
call_end
