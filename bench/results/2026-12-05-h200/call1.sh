#!/bin/bash
# Planned first call of the next session lent a device (written in the forty-sixth session, which
# had none): carry .whl (llguidance + jsonschema wheels for Python 3.12, see run-helper.sh's
# call_begin) so that the structured-output tests run too.
# 1. The GPU test suite: not run since the forty-fourth session made graphed CPU expert calls
#    the default in resident steps (WRITESCOPE_CPU_EXPERTS_GRAPHED=auto), nor on the
#    forty-fifth's sampler (batched draws, top-k copies, processors on CUDA) or the
#    forty-sixth's structured outputs (masks unpacked on the device). If the graphed-call tests
#    fail, cpu_experts_graph.mode()'s default goes back to "off".
#    Also the forty-eighth's automatic prefix caching, on by default: its CUDA parity test
#    (test_gpu_e2e.py::test_cuda_prefix_cache_hits_match_transformers) and every other GPU
#    test that runs a prompt twice on one engine now starts the second from cached blocks; if
#    those fail, LLMEngine's enable_prefix_caching default goes to False until fixed.
# 2. The sampler's and the grammars' costs on the H200 (bench.sampler, bench.structured).
# 3. The batch-1 CPU-experts rows on the auto default (DeepSeek-V2-Lite 1 x 8K, Qwen3 1 x 1K),
#    graphed against eager (WRITESCOPE_CPU_EXPERTS_GRAPHED=0) alternating.
source bench/results/run-helper.sh
call_begin 580
gpu_tests 400
grep -E "passed|failed" $R/gpu-tests.log | tail -3
run sampler 40 python -m writescope.bench.sampler --device cuda --batch 1 8 32 128 \
  --json $R/sampler.json
run structured 40 python -m writescope.bench.structured --device cuda --batch 1 8 32 \
  --json $R/structured.json
P=bench/profiles/h200.json
for g in auto 0; do
  run d1-8k-g$g 45 env WRITESCOPE_CPU_EXPERTS_GRAPHED=$g python -m writescope bench \
    --model deepseek-v2-lite --random-weights --profile $P --vram-budget 32GiB --experts cpu \
    --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 24 --prefill synthetic \
    --no-progress --policies writescope --batch 1 --context-lengths 8k --out $R/d1-8k-g$g
done
call_end
