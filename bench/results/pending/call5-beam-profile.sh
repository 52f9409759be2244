#!/bin/bash
# Written in the eighty-second session (no device machine was lent): where a beam search step's
# time goes on the GPU machine. The seventy-sixth session's H100 host took 15.2-15.8 ms a beam
# step at 32K against 1.9 ms a decode step of as many sequences; on the Zen 4 dev VM the host's
# bookkeeping of a 32K beam step (adding the four requests, scheduling, the cache's begin and end,
# the outputs) is ~3.4 ms against ~2.1 ms for a decode step, so most of the H100's extra 13 ms is
# not that bookkeeping as the dev VM runs it. This call times the same rows again and then runs
# a 32K search under cProfile (`--cprofile 8`: the Python functions by host ms a step; a step's
# device work shows as the launching thread's waits). CALL_S=150; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-150}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run beam 110 env WRITESCOPE_ALLOW_LONG_MAX_MODEL_LEN=1 python -m writescope.bench.beam_search \
  --contexts 4096 32768 --beam-width 4 --steps 8 --reps 2 --max-num-batched-tokens 8192 \
  --cprofile 8 --top 40 --json $R/beam.json
sed -n '/context/,/cProfile/p' $R/beam.log | head -8
call_end
