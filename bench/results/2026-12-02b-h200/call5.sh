#!/bin/bash
# Seventeenth session, call 5: the AVX-512 BF16 kernel of this session against the session's
# starting kernel (51bbe7d), and the AMX kernel likewise (its code unchanged but for exp2_fast's
# move into attn_v512.h), each timed call by call on the same pools (bench.cpu_ab), 16 threads.
source bench/results/run-helper.sh
call_begin 300
run ab-bf16 120 python -m writescope.bench.cpu_ab --against 51bbe7d --isa avx512bf16 --reps 7 --json $R/cpu_ab_bf16.json
run ab-amx 120 python -m writescope.bench.cpu_ab --against 51bbe7d --isa amx --reps 7 --json $R/cpu_ab_amx.json
call_end
