# 2026-12-04h call 3: the GPU suite on the session's final engine (the link off by default) and
# the H2D rate from the CPU experts' registered memory against torch's pinned memory.
source bench/results/run-helper.sh
call_begin 480
run dma-probe 60 python bench/results/2026-12-04h-h200/dma_probe.py
gpu_tests 360
call_end
