#!/bin/bash
# Twenty-third session, call 2: the AMX kernel's prefetch distance beside the link (the
# calibration picks it with the CPU alone; under H2D DMA the DRAM latency is longer), as issue
# 9's spilled table at distances 1 / 2 / 3 (MLA only) / 1 (MLA only), seven timed steps per share; issue 8's
# table with distances 1 and 2 on the same host; issue 6's Qwen3-30B-A3B 2 x 128K row with the
# experts on the GPU (writescope, transfer, cpu; two rounds) against this call's calibration.
source bench/results/run-helper.sh
call_begin 575
HYB_PF=1 hybrid_table hyb-pf1 70
HYB_PF=2 hybrid_table hyb-pf2 70
HYB_PF=3 hybrid_table hyb-pf3 45 --shapes mla
HYB_PF=1 hybrid_table hyb-pf1b 45 --shapes mla
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --prefetch-blocks 1,2 --json $R/cpu_attention.json
calibrate_profile 45
run qwen3-gpu-experts 230 python -m writescope bench --model qwen3-30b-a3b --random-weights \
  --profile $P --vram-budget 68GiB --experts gpu --batch 2 --context-lengths 128k \
  --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic \
  --no-progress --rounds 2 --policies writescope,transfer,cpu --out $R/qwen3-gpu-experts
call_end
