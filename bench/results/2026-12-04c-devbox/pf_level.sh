#!/bin/bash
# The dev-VM A/B of the AVX-512 BF16 kernel's prefetch level (pf_level.log): this tree's
# kernel (PREFETCHT0, L1) against a copy of its sources prefetching into L2 (PREFETCHT1), call
# by call. Run from the repository root. (Since then the L2 form is also the variant
# avx512bf16-l2 of this tree, csrc/attn_bf16_l2.cpp.)
set -e
rm -rf /tmp/csrc_t1 && cp -r writescope/attention/csrc /tmp/csrc_t1
sed -i 's/^#define WS_BF16_PF_HINT _MM_HINT_T0/#define WS_BF16_PF_HINT _MM_HINT_T1/' /tmp/csrc_t1/attn_bf16.cpp
python -m writescope.bench.cpu_ab --csrc /tmp/csrc_t1 --isa avx512bf16 --threads 2 --sizes 8x32K,1x256K --reps 9 --json bench/results/2026-12-04c-devbox/pf_level.json
