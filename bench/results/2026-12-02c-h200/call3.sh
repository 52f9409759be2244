#!/bin/bash
# Eighteenth session, call 3: the AMX kernel's C-layout Q.K on token-major copies (WS_QK_TM,
# this tree's default) against the kernel of bd6150f (parity form), call by call on the same
# pools (bench.cpu_ab, --csrc tmp_ab_csrc/old = `git archive bd6150f writescope/attention/csrc`),
# twice; GQA decode (8 rows a chunk) takes the unchanged path: its ratio is the noise control.
# Then the phases of both builds (bench.cpu_phases --defines) and the GPU tests.
source bench/results/run-helper.sh
call_begin 480
run ab-amx 100 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/old --isa amx --reps 15 --json $R/cpu_ab_amx.json
run phases 90 python -m writescope.bench.cpu_phases --shapes mla-16/1/576 --threads 1,16 --pools 0.5,1536 \
  --prefetch-blocks 1 --seconds 1.0 --defines ";WS_QK_TM=0" --json $R/cpu_phases.json
run ab-amx-again 100 python -m writescope.bench.cpu_ab --csrc tmp_ab_csrc/old --isa amx --reps 15 --json $R/cpu_ab_amx_again.json
gpu_tests 170
call_end
