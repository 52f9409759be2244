#!/bin/bash
# Eighteenth session, call 4, on the token-major Q.K kernel (call 3).
# (1) P.V's tile registers: V in three tiles in turn (WS_PV_REGS=1) or P in two (=2) against the
#     default (P in tile 4, V in 6/7), side by side (bench.cpu_phases --defines) and call by call
#     (bench.cpu_ab against tmp_ab_csrc/pv1, pv2: copies of this tree's csrc with the knob set;
#     the ratio is default / variant); longer passes (WS_KSB=512) side by side too.
# (2) Issue 8's table, issue 9's hybrid (MLA, GQA) and issue 6's DeepSeek-V2-Lite 4x128K with the
#     experts on the GPU (the seventeenth session's call 4 command) on this kernel.
source bench/results/run-helper.sh
call_begin 540
run pv-phases 100 python -m writescope.bench.cpu_phases --shapes mla-16/1/576,gqa-32/4/128 --threads 16 \
  --pools 0.5,1536 --prefetch-blocks 1 --seconds 1.0 --defines ";WS_PV_REGS=1;WS_PV_REGS=2;WS_KSB=512" --json $R/pv_phases.json
run ab-pv1 50 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/pv1 --isa amx --reps 11 --json $R/cpu_ab_pv1.json
run ab-pv2 50 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/pv2 --isa amx --reps 11 --json $R/cpu_ab_pv2.json
run cpu-attn 90 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --no-gpu-layout --json $R/cpu_attention.json
run hybrid-mla-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes mla --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.45,0.5,0.55,0.6,1 --json $R/gpu_attention-hybrid-mla-16.json
run hybrid-gqa-16 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.gpu_attention --shapes gqa --skip resident --reps 2 \
  --cpu-threads 16 --shares 0,0.5,0.55,0.6,0.65,1 --json $R/gpu_attention-hybrid-gqa-16.json
calibrate_profile 45
run dsv2-gpu-experts 200 env WRITESCOPE_STACKS_EVERY_S=190 python -m writescope bench \
  --model deepseek-v2-lite --random-weights --profile $P --vram-budget 38GiB --experts gpu \
  --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --rounds 2 \
  --policies writescope,transfer,cpu --out $R/dsv2-gpu-experts
call_end
