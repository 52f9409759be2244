#!/bin/bash
# Fourteenth session, call 4 (the last 7 device minutes): this session's final tree -- call 2's
# plus the optimiser's bend in the CPU experts' term, the resident summary's kernel-time column
# and the rows' per-thread CPU time -- through the resident bench and the GPU tests.
source bench/results/run-helper.sh
call_begin 300
run resident 60 python -m writescope.bench.gpu_attention --skip spilled --reps 2 \
  --json $R/gpu_attention-resident.json
gpu_tests 170
call_end
