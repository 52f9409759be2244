#!/bin/bash
# Seventieth session, call 3, on the session's final engine code (admission reserves the tokens
# a request writes; a temperature below 1e-5 samples greedily; an interrupted generate aborts
# its requests; engine options checked before the weights load; a tool call cut short stays a
# call): the whole GPU suite first (cap CALL_S - 150, at most 400 s), then issue 8's table once
# more (call 2's host: MLA 8 x 32K at 83% of the best vector probe by median, the other five
# shapes 88-96%). Carry .whl. CALL_S=540 (timeout 575).
source bench/results/run-helper.sh
call_begin ${CALL_S:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
gpu_tests $(( ${CALL_S:-540} - 150 < 400 ? ${CALL_S:-540} - 150 : 400 ))
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
run cpu-attn 100 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 \
  --json $R/cpu_attention.json
tail -3 $R/cpu-attn.log
call_end
