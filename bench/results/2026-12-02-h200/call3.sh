#!/bin/bash
# Sixteenth session, call 3, the session's last tree. Since call 2: the AMX kernel divides the
# queries' scale * log2(e) back out before rounding them to bf16 and applies it to the fp32
# scores (one token's lse was off by up to 5e-3, now 1e-6); the Q.K chunking (no gain in call 2)
# is gone. (1) The tile unit's rates on this host beside a prefetch stream (the dev VM's
# microbenchmark); (2) the CPU attention bench; (3) the hybrid rows of both families at 16 CPU
# threads; (4) the GPU tests; (5) Qwen3 4 x 128K, experts on the CPU, writescope against static
# in three rounds.
source bench/results/run-helper.sh
call_begin 560
run microbench 40 bash -c "gcc -O2 -mamx-tile -mamx-bf16 -mavx512f bench/microbench/amx_l2_beside_prefetch.c -o $R/l2pf && $R/l2pf"
calibrate_profile 60
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 0 --no-variants \
  --no-gpu-layout --prefetch-blocks 0,1,2 --json $R/cpu_attention.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
gpu_tests 160
run qwen3-cpu 200 python -m writescope bench --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --batch 4 --context-lengths 128k --random-weights --profile $P --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 3 \
  --policies writescope,static --out $R/qwen3-cpu
call_end
