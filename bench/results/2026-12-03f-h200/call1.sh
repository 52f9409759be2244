#!/bin/bash
# Thirty-first session, call 1: the whole GPU suite on the thirtieth session's final code (the
# model build's init change and test_resident_steps_around_eager_cpu_expert_calls have not run on
# a GPU), then the batch-1 CPU-experts step (Qwen3-30B-A3B 1 x 1K, 32 GiB, step_profile) with
# resident attention forced around the eager expert calls against the default hybrid path,
# alternating, then issue 6's Mixtral-8x7B 2 x 128K row with the experts on the GPU (not run
# since the twenty-fourth session) if time is left.
source bench/results/run-helper.sh
call_begin 560
gpu_tests 180
P=bench/profiles/h200.json
q1() { run q1-1k-$1-$2 50 env WRITESCOPE_RESIDENT_ATTENTION=$3 python -m writescope.bench.step_profile \
  --model qwen3-30b-a3b --random-weights --profile $P --prefill synthetic --batch 1 --context 1k \
  --experts cpu --vram-budget 32GiB --top 30 --steps 8 --warmup 3 --json $R/q1-1k-$1-$2.json; }
q1 default a 1; q1 force a force; q1 default b 1; q1 force b force
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run mixtral-128k 150 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 --context-lengths 128k $G --out $R/mixtral-128k
call_end
