#!/bin/bash
# Twenty-eighth session, call 3: the GPU tests again (resident steps now only where the whole
# step is graph-safe: with the experts on the CPU they diverged in call 1), then where the GPU's
# time goes in Qwen3-30B-A3B's 2 x 32K step with the experts on the GPU: call 1 showed the host
# idle for 15.8 of its 19.3 ms once the step is one graph, so the device itself takes ~5x the
# 3.9 ms bound. bench.step_profile now lists kernels by device time; once graphed (do the
# profiler's records see inside a graph?) and once eager (WRITESCOPE_CUDA_GRAPHS=0).
source bench/results/run-helper.sh
call_begin 560
gpu_tests 150
P=bench/profiles/h200.json
host_profile q2-32k-gpu 90 2 32k gpu 68GiB --top 40
export WRITESCOPE_CUDA_GRAPHS=0
host_profile q2-32k-gpu-eager 90 2 32k gpu 68GiB --top 40
unset WRITESCOPE_CUDA_GRAPHS
call_end
