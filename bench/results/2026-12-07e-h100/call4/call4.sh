#!/bin/bash
# Seventy-seventh session, call 4: the AMX kernel with WS_PF_SPREAD=1 as its default (calls 2
# and 3): the CPU attention tests on a CPU with AMX and AVX-512 BF16 (the real tile unit and the
# emulated builds of every compile-time knob, -DWS_PF_SPREAD=0 among them), the new default
# against the old build call by call (--defines WS_PF_SPREAD=0), and issue 8's table on it.
# Carry .whl. CALL_S=190.
source bench/results/run-helper.sh
call_begin ${CALL_S:-190}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
run cpu-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_attention.py tests/test_cpu_attention_amx_emu.py -rs
tail -3 $R/cpu-tests.log
run ab-old 45 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=0" --reps 9 --json $R/ab-old.json
grep -v "^\[" $R/ab-old.log | tail -8
run cpu-attn 40 python -m writescope.bench.cpu_attention --reps 3 --torch-reps 1 --json $R/cpu_attention.json
grep -v "^\[" $R/cpu-attn.log | tail -12
call_end
