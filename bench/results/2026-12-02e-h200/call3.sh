#!/bin/bash
# Twentieth session, call 3: MLA with no copy at all. amx_mla_pass.c (call 2) found the token-major
# Q.K's copy as costly as its tile work, and not overlapped with it. The T (GPU) layout reads K
# rows in place for Q.K; -DWS_PV_PAR=1 makes its P.V read V in place too (parity form: twice the
# P.V products, no pair-interleaved copy). bench.cpu_ab --layouts C,T times this tree on both
# layouts and the knob's build on both (its C-layout path is unchanged: a control), twice.
source bench/results/run-helper.sh
call_begin 300
run ab-par 120 python -m writescope.bench.cpu_ab --layouts C,T --defines WS_PV_PAR=1 --isa amx --reps 9 --json $R/cpu_ab_par.json
run ab-par-again 120 python -m writescope.bench.cpu_ab --layouts C,T --defines WS_PV_PAR=1 --isa amx --reps 9 --json $R/cpu_ab_par_again.json
call_end
