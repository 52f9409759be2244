#!/bin/bash
# Fifteenth session, call 2. Call 1's CPU attention bench found the AMX tile unit streaming
# 107.6 GB/s (no software prefetch) and 130.3 GB/s (prefetch 64 KB ahead) over the probe array
# where the vector-load read probe read 88.9 GB/s (16 threads; 84.0 / 89.2 against 82.7 at the
# run's end). (1) every way of reading the array (`writescope.bench.read_probes`: vector sum,
# with and without prefetch, torch.sum, tile loads with and without prefetch), interleaved in
# rounds, alone and beside a pinned H2D copy, at 16 and 14 threads; (2) the CPU attention bench
# again; (3) the MLA hybrid rows again (call 1: 88 / 84 / 82% of the combined ceiling) and the
# GQA ones; (4) the read probes once more; (5) the GPU tests.
source bench/results/run-helper.sh
call_begin 420
run read-probes 90 python -m writescope.bench.read_probes --threads 16,14 --rounds 3 --json $R/read_probes.json
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
run hybrid-mla 90 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla.json
run hybrid-gqa 90 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa.json
run read-probes-2 60 python -m writescope.bench.read_probes --threads 16,14 --rounds 2 --json $R/read_probes-2.json
gpu_tests 160
call_end
