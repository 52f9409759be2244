#!/bin/bash
# Planned first call of the fifty-fourth session (carry .whl: llguidance 1.9.1 and jsonschema
# with its dependencies; see call1-full-suite.sh's header to rebuild it). Works on an H100 or an
# H200 machine. Refused starts left ~900 s of device time (a start takes ~200 s), so one call of
# 470 s takes what the fifty-third's two planned calls asked first:
# (Listed in the order of the fifty-third's plan; run in the order below.)
# 1. The GPU tests the fifty-third session's H100 run did not reach (it stopped after 201 of
#    230: test_mla_absorb, test_moe_triton, test_pdl, test_prefill, test_resident_*,
#    test_router_logits, test_selfmerge) and test_grammar with llguidance 1.9.1 (1.6.1 failed).
# 2. The FP8 decode MoE kernels' variants on the GPU (bench.gpu_experts --fp8-variants): which
#    conversion and launch settings get nearer to bf16's 78-99% of the HBM copy rate.
# 3. The CPU expert kernel over FP8 experts on the 16-core AMX host: the exact-products decode
#    kernel (new, the default) against the bf16(q * s) one (fp8-rounded) and bf16 weights, at
#    the 4096-byte prefetch distance (1.15-1.25x at 1 and 4 tokens on the 2-core dev VM).
# 4. The AMX attention kernel's WS_PF_SPREAD=1 against the default (1.02-1.08x on the dev VM).
# 5. The FP8 kernels' interpreter test on this host, with its reason (it failed there once).
# Ordered by what the session needs most (CALL_S=... shortens the call: the runs past its
# deadline are skipped).
source bench/results/run-helper.sh
call_begin ${CALL_S:-470}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
run experts-fp8 100 python -m writescope.bench.cpu_experts --models qwen3-30b-a3b \
  deepseek-v2-lite mixtral-8x7b --tokens 1 4 --backends cpp --weights fp8 fp8-rounded bf16 \
  --isas avx512bf16 --footprint-gb 2 --min-seconds 0.15 --json $R/cpu_experts_fp8.json
run moe-fp8 90 python -m writescope.bench.gpu_experts --models qwen3-30b-a3b,deepseek-v2-lite,mixtral-8x7b \
  --tokens 1,4 --weights bf16,fp8 --fp8-variants --no-torch --json $R/gpu_experts_fp8.json
run ab-spread 55 python -m writescope.bench.cpu_ab --defines "WS_PF_SPREAD=1" \
  --shapes gqa-32/4/128,mla-16/1/576 --sizes 1x256K,8x32K --reps 7 --prefetch-blocks 1 \
  --json $R/ab_spread.json
run gpu-tests 150 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_grammar.py \
  tests/test_moe_triton.py tests/test_mla_absorb.py tests/test_pdl.py tests/test_prefill.py \
  tests/test_resident_merge.py tests/test_resident_write.py tests/test_router_logits.py \
  tests/test_selfmerge.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
run fp8-interp 40 python -m pytest -q -p no:cacheprovider --tb=short -rf \
  tests/test_fp8_device_experts.py::test_fused_fp8_experts_under_the_interpreter
grep -E "passed|failed|Error|error" $R/fp8-interp.log | head -8
call_end
