#!/bin/bash
# The next call to make (written in the eighty-first session, whose device time ran out before
# it): the whole GPU suite (the call before an issue touching GPU code is resolved; H100 hosts
# took 206-401 s, the H200 210-260 s; last whole run the seventy-seventh's), now with the CPU
# experts' result read in place by default, then issue 6's CPU-experts Qwen3-30B-A3B 4 x 128K
# row (writescope and static; the seventy-eighth's 0.850 and 0.841 of the bound, with the
# result copied) under the defaults, or the settings in $BEST (e.g.
# "WRITESCOPE_CPU_EXPERT_RESULT=copy" for the old path), exported after the suite.
# .whl is not in git (.git/info/exclude); on a fresh dev machine rebuild it first:
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
#   python3 -m pip download $P --platform manylinux_2_31_x86_64 -d .whl llguidance==1.9.1
#   python3 -m pip download $P --platform manylinux_2_17_x86_64 -d .whl jsonschema==4.26.0 \
#     jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
# CALL_S=560; carry .whl.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 400
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
calibrate_profile 45
echo "settings: ${BEST:-defaults}" | tee $R/settings.txt
[ -n "$BEST" ] && export $BEST
cpu_grid qwen3-cpu 150 qwen3-30b-a3b 4 128k --policies writescope,static
row_summary qwen3-cpu
call_end
