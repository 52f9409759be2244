#!/bin/bash
# Thirty-seventh session, call 4 (the device time's rest): why Mixtral-8x7B's G pool held 1,017
# blocks in call 3 (1,025 in the thirty-sixth session): the engine built as issue 6's 2 x 32K
# row builds it, with dependent launches on and off and with cuBLAS used before the activation
# measurement (act_check.py); then the routed experts' launch settings at Mixtral's 2 tokens.
source bench/results/run-helper.sh
call_begin 190
D=bench/results/2026-12-04b-h200
export PYTHONPATH=$PWD  # act_check.py runs as a script (the first run lacked this line)
run act-pdl 35 python $D/act_check.py
run act-nopdl 35 env WRITESCOPE_PDL=0 python $D/act_check.py
run act-cublas 35 python $D/act_check.py --cublas-first
run experts-m 90 python -m writescope.bench.gpu_experts --sweep --models mixtral-8x7b --tokens 2 --no-torch --reps 5 --json $R/experts-m.json
call_end
