#!/bin/bash
# Twenty-ninth session, call 4: CPU expert calls captured in the step's CUDA graph
# (layers/cpu_experts_graph.py): the GPU tests of the files it touches, then the batch-1 and
# batch-4 CPU-experts steps (Qwen3-30B-A3B x 1K, 32 GiB) graphed and eager
# (WRITESCOPE_CPU_EXPERTS_GRAPHED=0, call 1-3's code path), alternating; and graphed with the
# native queue spinning 500 us on each call's ready word (WRITESCOPE_CPU_EXPERT_SPIN_US).
source bench/results/run-helper.sh
call_begin 300
run gpu-tests-touched 150 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_graphs.py \
  tests/test_gpu_e2e.py tests/test_cpu_experts.py tests/test_cpu_job_queue.py tests/test_moe_triton.py
P=bench/results/2026-12-03d-h200/call1/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
A="--top 40 --steps 6 --warmup 3 --cprofile 0"
host_profile q1-graphed 45 1 1k cpu 32GiB $A
export WRITESCOPE_CPU_EXPERTS_GRAPHED=0; host_profile q1-eager 45 1 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERTS_GRAPHED
host_profile q4-graphed 45 4 1k cpu 32GiB $A
export WRITESCOPE_CPU_EXPERTS_GRAPHED=0; host_profile q4-eager 45 4 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERTS_GRAPHED
export WRITESCOPE_CPU_EXPERT_SPIN_US=500; host_profile q1-graphed-spin 45 1 1k cpu 32GiB $A; unset WRITESCOPE_CPU_EXPERT_SPIN_US
call_end
