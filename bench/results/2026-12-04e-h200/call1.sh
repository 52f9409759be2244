#!/bin/bash
# Fortieth session, call 1: (1) the AVX-512 BF16 kernel's final T path (blocks read in place, the
# T form a template parameter) against the build that copied each T block into the C layout's
# pairs first (bb39e0a's csrc, copied beside this script by `git archive`: the device's git
# history is stale), call by call on this host, for Mixtral-8x7B's GQA shape and Qwen3's;
# (2) issue 9's MLA rows with the staging plan reused across steps (WRITESCOPE_STAGE_PLAN_REUSE=1,
# the new default) and planned every step (=0), in alternating order, six shares around the
# balance; (3) the whole GPU test suite on this package.
# The folder was made on the dev machine before the call (and not committed):
#   D=bench/results/2026-12-04e-h200/csrc-bb39e0a; mkdir -p $D
#   git archive bb39e0a writescope/attention/csrc | tar x --strip-components=3 -C $D
source bench/results/run-helper.sh
call_begin 560
run cpu-ab-t 80 python -m writescope.bench.cpu_ab --csrc bench/results/2026-12-04e-h200/csrc-bb39e0a --layouts C,T --isa avx512bf16-l2 \
  --shapes gqa-32/8/128,gqa-32/4/128 --reps 7 --json $R/cpu_ab_t.json
S="0,0.55,0.575,0.6,0.625,1"
for v in 1 0 0 1; do
  k=$((k + 1))
  export WRITESCOPE_STAGE_PLAN_REUSE=$v
  hybrid_table hyb-mla-$k-reuse$v 42 --shapes mla --shares $S
done
unset WRITESCOPE_STAGE_PLAN_REUSE
gpu_tests 290
call_end
