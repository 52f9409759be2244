#!/bin/bash
# Twenty-eighth session, call 5 (call 4 was never started: the device refused four starts and
# ~150 s of device time is all that is left): the GPU tests of the files this session's GPU code
# touches -- the fused RMSNorm and rotation (tests/test_fused_layers.py), the narrower gate/up
# programs (tests/test_moe_triton.py), the resident steps and graphs (tests/test_graphs.py), and
# the end-to-end runs against transformers (tests/test_gpu_e2e.py) -- then, if time is left, the
# Qwen3-30B-A3B 2 x 32K step's time and device time (calls 1 and 3: 19.3-19.6 ms, 14.7 ms).
source bench/results/run-helper.sh
call_begin 150
run gpu-tests-touched 115 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_fused_layers.py \
  tests/test_moe_triton.py tests/test_graphs.py tests/test_gpu_e2e.py
P=bench/profiles/h200.json
host_profile q2-32k-gpu 30 2 32k gpu 68GiB --top 40 --steps 3 --warmup 3 --cprofile 0
call_end
