#!/bin/bash
# Fifteenth session, call 1. (1) calibrate; (2) the CPU attention bench with the new AMX
# tile-load read probe beside the vector-load read probe (on the 2-core dev VM tile loads stream
# at 82-89% of vector loads: the ceiling of a tile-load kernel there), at 16 threads and at the
# hybrid step's 14, with the prefetch distances 0/1/2; (3) the MLA hybrid rows at the
# calibrated distance 1; (4) the GPU tests; (5) the experts-on-CPU rows planned in the
# fourteenth session (bench/results/next-calls/call1.sh): Qwen3-30B-A3B batch 4 at 96K and 128K,
# 32 GiB, writescope / static / transfer in two rounds, rows recording each thread's CPU time.
source bench/results/run-helper.sh
call_begin 575
calibrate_profile 60
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
run cpu-attn-14 60 python -m writescope.bench.cpu_attention --threads 14 --reps 3 --torch-reps 0 \
  --no-variants --no-gpu-layout --prefetch-blocks 1 --json $R/cpu_attention-14.json
run hybrid-mla 90 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --shares 0,0.4,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla.json
gpu_tests 160
run qwen3-cpu 330 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 96k,128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,static,transfer --out $R/qwen3-cpu
call_end
