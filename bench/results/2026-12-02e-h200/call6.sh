#!/bin/bash
# Twentieth session, call 6 (the last device seconds): the C layout alone against 1aa76ca's
# kernel, two builds alternating (call 5's four-way rotation read this tree's C path 0.975-0.996x,
# its code unchanged), twice.
source bench/results/run-helper.sh
call_begin 110
run ab-c 50 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --isa amx --reps 12 --json $R/cpu_ab_c.json
run ab-c-again 50 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/base --isa amx --reps 12 --json $R/cpu_ab_c_again.json
call_end
