#!/bin/bash
# Fortieth session, call 5 (the session's last device time), on the final package: issue 9's
# spilled table and issue 8's table (the kernel's calls rotating through copies of the KV, the
# bench's new default) once more.
source bench/results/run-helper.sh
call_begin 200
hybrid_table hyb 90
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
call_end
