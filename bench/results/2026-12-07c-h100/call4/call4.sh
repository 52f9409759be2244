#!/bin/bash
# Seventy-fifth session, call 4: issue 8's table twice more on a fresh host (calls 1 and 3 met
# slow hosts), with the device time left (about 470 s). Carry .whl. CALL_S=150 (timeout 180).
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
for i in 1 2; do
  run cpu-attn-$i 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention-$i.json
  tail -10 $R/cpu-attn-$i.log
done
call_end
