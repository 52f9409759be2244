#!/bin/bash
# Fortieth session, call 4: issue 8's table with the kernel's calls rotating through copies of
# each shape's KV that span the read probe's array (the bench's new default: one call's KV,
# 0.3-0.5 GB, is about the host's 300 MB last-level cache, and calls timed back to back on the
# same KV read part of it from there), then with every call on the same KV (--warm, the way of
# every earlier table), then rotating again.
source bench/results/run-helper.sh
call_begin 240
run cpu-attn-cold 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention_cold.json
run cpu-attn-warm 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --warm --json $R/cpu_attention_warm.json
run cpu-attn-cold2 70 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention_cold2.json
call_end
