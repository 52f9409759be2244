#!/bin/bash
# Twenty-ninth session, call 3 (on call 1-2's machine): the batch-1 CPU-experts step (Qwen3 1 x 1K,
# 32 GiB) under the OpenMP team's and the expert threads' existing knobs, to see which part of
# the ~0.43 ms a layer outside the expert kernel they move.
source bench/results/run-helper.sh
call_begin 330
P=bench/results/2026-12-03d-h200/call1/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
A="--top 40 --steps 6 --warmup 3 --cprofile 0"
host_profile q1-default 45 1 1k cpu 32GiB $A
export WRITESCOPE_CPU_EXPERT_THREADS=14; host_profile q1-threads14 45 1 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERT_THREADS
export GOMP_SPINCOUNT=50000000; host_profile q1-spin 45 1 1k cpu 32GiB $A; unset GOMP_SPINCOUNT
export OMP_WAIT_POLICY=passive; host_profile q1-passive 45 1 1k cpu 32GiB $A; unset OMP_WAIT_POLICY
export WRITESCOPE_CPU_WAIT=host; host_profile q1-hostwait 45 1 1k cpu 32GiB $A; unset WRITESCOPE_CPU_WAIT
call_end
