#!/bin/bash
# The whole GPU suite on one tree: the call to make before an issue touching GPU code is
# resolved. Last run whole in the sixty-fourth session: on 9d56832 (H100, call 1) 268 passed, 6
# skipped (the server test modules, which the device cannot import) in 206 s, the FP8
# interpreter test 62 s, call wall time 308 s; on a58ecf0 (H100, call 6, without the FP8 test)
# 270 passed, 6 skipped in 283 s (bench/results/2026-12-06d-h100); in the sixty-fifth, 294 s on
# one H100 host and 401 s on another (2026-12-06e-h100, calls 1 and 3: a 400 s cap cut the
# latter as it printed its summary). Give it CALL_S=560 and the suite 420 s or more. Carry
# .whl: llguidance 1.9.1 -- 1.6.1 failed the grammar test -- and jsonschema with its
# dependencies; accelerate is in the image. Works on an H100 or an H200 machine.
# .whl is not in git (.git/info/exclude); on a fresh dev machine rebuild it first:
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
#   python3 -m pip download $P --platform manylinux_2_31_x86_64 -d .whl llguidance==1.9.1
#   python3 -m pip download $P --platform manylinux_2_17_x86_64 -d .whl jsonschema==4.26.0 \
#     jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
# 1. The whole GPU suite, one line a test.
# 2. The FP8 kernels' interpreter test with room to finish (69 s on the dev VM, 78 s on the H100
#    host; a 40 s cap killed it on an H200 host, a 120 s cap on the fifty-seventh session's
#    H100 host; 107 s on the fifty-eighth's).
# 3. The host's time a decode step in the cache's begin_step/end_step (the step plan as array
#    work over the batch since the sixty-second session), the default model at batch 4 and 64.
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
run fp8-interp 200 python -m pytest -q -p no:cacheprovider --tb=short -rf \
  tests/test_fp8_device_experts.py::test_fused_fp8_experts_under_the_interpreter
grep -E "passed|failed|Error|error" $R/fp8-interp.log | head -8
for b in 4 64; do
  run overhead-b$b 60 python -m writescope.bench.policy_overhead --policies transfer,writescope \
    --batch $b --prompt 1000 --steps 40 --json $R/overhead-b$b.json
  grep begin_step $R/overhead-b$b.log
done
call_end
