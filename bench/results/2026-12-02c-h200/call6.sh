#!/bin/bash
# Eighteenth session, call 6 (the session's last device minutes): P.V with a PREFETCHT0 of the
# next group's V lines (L2 -> L1) issued under this group's tile products (WS_PV_PF=1, this
# tree) against the same tree with it off (tmp_ab_csrc/nopf: WS_PV_PF=0), call by call, twice;
# then the GPU tests with whatever time is left.
source bench/results/run-helper.sh
call_begin 230
run ab-pvpf 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/nopf --isa amx --reps 11 --json $R/cpu_ab_pvpf.json
run ab-pvpf-again 45 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/nopf --isa amx --reps 11 --json $R/cpu_ab_pvpf_again.json
gpu_tests 150
call_end
