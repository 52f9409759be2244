#!/bin/bash
# Planned first call of the next session lent a device (written in the fiftieth session, whose
# call 1 found 16 tiny_mixtral CUDA parity checks 1.36e-4 off transformers at one step's top-5
# (tolerance 1e-4) and whose later starts were all refused; carry .whl as in run-helper.sh).
# 1. The whole GPU suite with the float64 transformers oracle (eager experts; tests/conftest.py
#    hf_model, tests/test_parity.py reference): the 16 failures should pass.
# 2. Why they failed (parity_oracles.py): the engine on CUDA and on the CPU against transformers
#    in float32 with grouped_mm experts (the old oracle), float32 eager experts and float64.
# 3. Issue 6's five-policy rows, experts on the CPU, Qwen3 4 x 32K (not re-run since the
#    thirty-ninth session).
source bench/results/run-helper.sh
call_begin 580
gpu_tests 330
grep -E "passed|failed" $R/gpu-tests.log | tail -3
run parity-oracles 60 python bench/results/pending/parity_oracles.py tests
grep -E "^engine|^reference|^  engine" $R/parity-oracles.log | head -40
P=bench/profiles/h200.json
run q4-32k 150 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 16 --prefill synthetic --no-progress --batch 4 --context-lengths 32k \
  --policies writescope,static,transfer,cpu,migrate --out $R/q4-32k
call_end
