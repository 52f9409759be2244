#!/bin/bash
# Written in the eighty-second session (no device machine was lent): the CPU kernels' software
# prefetch as a pointer walk (csrc/attn_impl.h's ws_pf_step, no 64-bit division a line in the GPU
# layout; on the Zen 4 dev VM the T layout read 1.00-1.07x, C unchanged) against the tree before
# it (a copy of this tree's csrc/ with ab/prefetch-walk.patch undone: 4e24f46f's attn_impl.h),
# call by call on the AMX host, both layouts: the T layout is what hybrid steps' CPU side reads in place (issue 6's Qwen3 row reads
# its CPU-read T blocks so; on the H200 the AMX kernel read GQA T at 57.9 GB/s against C's
# 110.3). Then issue 8's table on the same host. CALL_S=300; no carry needed (no GPU step).
source bench/results/run-helper.sh
call_begin ${CALL_S:-300}
OLD=/tmp/csrc-old; rm -rf $OLD; cp -r writescope/attention/csrc $OLD
(cd $OLD && git apply -R -p4 $OLDPWD/bench/results/pending/ab/prefetch-walk.patch) || echo "patch failed"
run kernel-ab 170 python -m writescope.bench.cpu_ab --csrc $OLD --layouts C,T \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K,64x4K --reps 7 --json $R/kernel-ab.json
grep -A8 "^shape" $R/kernel-ab.log
run cpu-attention 110 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
call_end
