#!/bin/bash
# Fifty-third session, call 2 as it could be made (carry .whl): three refused starts left ~470 s of
# device time, so only the first two parts of callB.sh (beside this; the rest is for a later
# session): the GPU tests call 1 did not reach with the grammar failure's reason, and the FP8
# decode MoE kernels' variants at Qwen3-30B-A3B's shape.
source bench/results/run-helper.sh
call_begin ${CALL_S:-200}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
run moe-fp8 70 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b \
  --tokens 1,4 --weights bf16,fp8 --fp8-variants --no-torch --json $R/gpu_experts_fp8.json
run gpu-tests-rest 130 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu \
  -q -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 \
  tests/test_grammar.py::test_cuda_constrained_rows_in_overlapped_batches \
  tests/test_fp8_device_experts.py tests/test_mla_absorb.py tests/test_moe_triton.py \
  tests/test_pdl.py tests/test_prefill.py tests/test_resident_merge.py tests/test_resident_write.py \
  tests/test_router_logits.py tests/test_selfmerge.py
grep -E "passed|failed|^FAILED|^E " $R/gpu-tests-rest.log | head -20
call_end
