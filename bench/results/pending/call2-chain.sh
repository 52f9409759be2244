#!/bin/bash
# Issue 6's CPU-experts 4 x 128K step beyond its kernels. The eightieth session's one call
# (bench/results/2026-12-07g-h100, H100): 342-347 ms a step (382 in the host's first run); the
# CPU's attention 137-144 ms and experts 152-172 ms, the waits experts -> attention 714-751 us a
# layer (34-35 ms a step; 1,295 us in the first run) against 150-170 us attention -> experts,
# and the link busy 308-348 ms of the device's 332-378 ms step, idle 16-20 ms between copies
# and 9-13 ms after its last. Suspect: the experts' result, a small host-to-device copy on the
# compute stream, waits behind the staging ring's 138-268 MB pieces on the copy engine (the
# attention's result is read in place and its waits are short). First the result-path bench
# (bench.result_path: the small copy's latency alone and beside such pieces, by copy engine and
# by in-place kernel), then the chain, one process each (the expert chain now also gives each
# call's result from seen to on the device: the copy's own time in the engine) (~75-85 s, the chain helper in
# run-helper.sh), the call's own calibration:
# - chain-result-kernel: WRITESCOPE_CPU_EXPERT_RESULT=kernel (the result read in place);
# - chain-equal: the defaults (a 276 MB layer as two 138 MB pieces in 3 slots);
# - chain-unequal: WRITESCOPE_STAGING_EQUAL_PIECES=0 (268 + 8 MB in 2 slots, as before);
# - chain-ahead: WRITESCOPE_STAGING_AHEAD=1 (the next step's first units staged during this
#   step's last layers; step_profile now prints the units used and dropped);
# - chain-equal-2: the defaults again (the eightieth's first run on a fresh host was slow).
# CALL_S=560; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run result-path 40 python -m writescope.bench.result_path --busy-mb 138,268 --reps 40 \
  --json $R/result_path.json
grep "link busy" $R/result-path.log
calibrate_profile 45
chain chain-result-kernel 95 WRITESCOPE_CPU_EXPERT_RESULT=kernel
chain chain-equal 95
chain chain-unequal 95 WRITESCOPE_STAGING_EQUAL_PIECES=0
chain chain-ahead 95 WRITESCOPE_STAGING_AHEAD=1
chain chain-equal-2 95
grep -h -E "^link|^staging plans" $R/chain-*.log
call_end
