#!/bin/bash
# Seventy-seventh session, call 2: the whole GPU suite on the session's merged tree (priority
# preemption, kept tails matched by their longest common start, the Responses API's additions,
# the arena in issue 8's bench), the AMX kernel's WS_PF_SPREAD=1 (the next pass's prefetch spread
# over this whole pass: 1.07-1.08x for MLA on the 2-core AMX dev VM, never timed on a 16-core
# host) against the default build call by call at the engine's prefetch distances 2 and 1, and
# issue 8's table once more. Carry .whl. CALL_S=520.
source bench/results/run-helper.sh
call_begin ${CALL_S:-520}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 400
tail -3 $R/gpu-tests.log
run ab-spread-pf2 60 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=1" --reps 9 --json $R/ab-spread-pf2.json
grep -v "^\[" $R/ab-spread-pf2.log | tail -9
run ab-spread-pf1 60 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=1" --reps 9 --json $R/ab-spread-pf1.json
grep -v "^\[" $R/ab-spread-pf1.log | tail -9
run cpu-attn 40 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
grep -v "^\[" $R/cpu-attn.log | tail -12
call_end
