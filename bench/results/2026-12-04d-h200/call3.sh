#!/bin/bash
# Thirty-ninth session, call 3: the AVX-512 BF16 kernel reading T blocks in place (a952be9)
# against the build before it (bb39e0a's csrc, copied beside this script by `git archive`
# because the device's git history is stale; it copied each T block into the C layout's pairs
# first), call by call on this host, for Mixtral-8x7B's GQA shape (32/8/128: the family for
# which the H200 host's calibrations choose this kernel) and Qwen3's (32/4/128); a calibration
# (its T rates); issue 9's spilled table and issue 8's table; and a second sample of call 1's
# attention-team question: DeepSeek-V2-Lite 4 x 128K and Qwen3-30B-A3B 2 x 128K, writescope at
# the default 14 threads against writescope@cpu_threads=15, two rounds of alternating order.
# The folder was made on the dev machine before the call (and not committed):
#   D=bench/results/2026-12-04d-h200/csrc-bb39e0a; mkdir -p $D
#   git archive bb39e0a writescope/attention/csrc | tar x --strip-components=3 -C $D
source bench/results/run-helper.sh
call_begin 540
run cpu-ab-t 90 python -m writescope.bench.cpu_ab --csrc bench/results/2026-12-04d-h200/csrc-bb39e0a --layouts C,T --isa avx512bf16-l2 \
  --shapes gqa-32/8/128,gqa-32/4/128 --reps 7 --json $R/cpu_ab_t.json
calibrate_profile 60
hybrid_table hyb 80
run cpu-attn 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
dsv2_row dsv2-threads 120 --policies writescope,writescope@cpu_threads=15 --decode-steps 12
qwen3_row qwen3-threads 170 --policies writescope,writescope@cpu_threads=15
call_end
