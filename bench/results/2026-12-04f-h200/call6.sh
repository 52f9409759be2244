#!/bin/bash
# Forty-first session, call 6: issue 8's table on the kernel variants and AMX prefetch distances
# the call's calibration chose (`--isa profile`, as the engine runs them: call 1 found distance 1
# the fastest with the KV cold, the bench's default is 2), then on the kernel's own default.
source bench/results/run-helper.sh
call_begin 110
calibrate_profile 30
run cpu-attn-profile 40 python -m writescope.bench.cpu_attention --isa profile --profile $P --reps 3 --torch-reps 1 --no-variants --json $R/cpu_attention_profile.json
run cpu-attn-auto 40 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --no-variants --json $R/cpu_attention_auto.json
call_end
