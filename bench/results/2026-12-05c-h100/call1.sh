#!/bin/bash
# Fifty-third session, call A (the first device call in three sessions; carry .whl: llguidance and
# jsonschema wheels -- accelerate is in the image). The machine lent may be an H100 (78 GiB):
# 1. What it is (GPU, CPU flags: AMX?).
# 2. The whole GPU suite (float64 oracle since the fiftieth session; the FP8 device experts'
#    GPU tests, never yet run on a GPU, are in it).
# 3. The decode MoE kernels, bf16 against FP8 weights (GB/s of bytes stored vs HBM copy).
# 4. The FP8 CPU-expert tests on this host (its AMX path, if it has AMX).
# 5. `writescope calibrate` for this machine's profile (issue 6's roofline on this host).
# 6. The fiftieth session's oracle diagnostic, if time is left.
source bench/results/run-helper.sh
call_begin 575
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(amx[a-z_0-9]*\).*/Flags: ... amx present .../' | tee $R/cpu.txt
lscpu > $R/lscpu.txt
gpu_tests 300
grep -E "passed|failed" $R/gpu-tests.log | tail -3
run moe-fp8 60 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b \
  --tokens 1,2,4,8 --weights bf16,fp8 --no-torch --json $R/gpu_experts_fp8.json
run fp8-tests 90 python -m pytest -q -p no:cacheprovider tests/test_cpu_experts_fp8.py \
  tests/test_fp8_checkpoints.py tests/test_fp8_device_experts.py
tail -3 $R/fp8-tests.log
calibrate_profile 50
run parity-oracles 50 python bench/results/pending/parity_oracles.py tests
grep -E "^engine|^reference|^  engine" $R/parity-oracles.log | head -20
call_end
