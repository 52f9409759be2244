#!/bin/bash
# Thirtieth session, call 1: graphed CPU expert calls (opt-in WRITESCOPE_CPU_EXPERTS_GRAPHED=1,
# buffers from torch's pinned allocator since f999ad0) -- their GPU tests, then the Qwen3 1K
# CPU-experts step graphed vs eager at batch 1 and 4 (alternating); DeepSeek-V2-Lite 4 x 32K
# experts-on-GPU (the host-bound guard: writescope should keep all KV on the GPU); and the whole
# GPU suite on the twenty-ninth session's final code (default path).
source bench/results/run-helper.sh
call_begin 565
run gpu-tests-graphed 100 env WRITESCOPE_CPU_EXPERTS_GRAPHED=1 WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json \
  python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 \
  tests/test_graphs.py tests/test_cpu_experts.py tests/test_cpu_job_queue.py
P=bench/profiles/h200.json
A="--top 40 --steps 6 --warmup 3 --cprofile 0"
export WRITESCOPE_CPU_EXPERTS_GRAPHED=1; host_profile q1-graphed 45 1 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERTS_GRAPHED
host_profile q1-eager 45 1 1k cpu 32GiB $A
export WRITESCOPE_CPU_EXPERTS_GRAPHED=1; host_profile q4-graphed 45 4 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERTS_GRAPHED
host_profile q4-eager 45 4 1k cpu 32GiB $A
run dsv2-32k 90 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 38GiB --experts gpu --batch 4 --context-lengths 32k --max-num-batched-tokens 16384 \
  --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress \
  --policies writescope,transfer,cpu --out $R/dsv2-32k
gpu_tests 180
call_end
