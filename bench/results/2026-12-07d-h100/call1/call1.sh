#!/bin/bash
# Seventy-sixth session, call 1: the whole GPU suite on 722168d (beam steps as BeamPrompts,
# kept partial blocks, priority scheduling, /v1/responses, QA merges), a beam step against
# a decode step of as many sequences on the default model at 4K and 32K tokens, on a5bec28's
# engine (.ab76/old, the bench module copied in) and on this tree's, then issue 8's table.
# Carry .whl. CALL_S=560.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
(cd .ab76/old && python -m writescope.bench.provenance) > $R/old-provenance.txt 2>&1
gpu_tests 380
tail -3 $R/gpu-tests.log
beam() {  # beam NAME: the beam bench on the tree in the working directory
  run beam-$1 50 env WRITESCOPE_ALLOW_LONG_MAX_MODEL_LEN=1 python -m writescope.bench.beam_search \
    --contexts 4096 32768 --beam-width 4 --steps 8 --reps 2 --max-num-batched-tokens 8192 \
    --json $R/beam-$1.json
  grep -A3 "context" $R/beam-$1.log
}
beam new
(cd .ab76/old && beam old)  # python -m puts the working directory first on sys.path
beam new2
run cpu-attn 60 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
tail -12 $R/cpu-attn.log
call_end
