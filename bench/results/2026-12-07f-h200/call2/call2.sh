#!/bin/bash
# Seventy-eighth session, call 2: issue 6's experts-on-CPU rows with decode steps split into two
# sub-batches (the runner's WRITESCOPE_PIPELINE_EXPERTS=all: each sub-batch's CPU attention and
# CPU experts overlapping the other's GPU work and hand-offs), against one batch, in one process
# round by round (bench variants split_spilled=1, team_lock=0, new). Call 1's single-batch row:
# 338.3 ms, 0.850 of the bound, the CPU chain (attention 151 ms + experts 146 ms) plus ~30 ms
# of hand-offs a step. team_lock=0: the two sub-batches' CPU teams may run at once (the old
# behaviour of =all). Carry .whl. CALL_S=270 (timeout 300).
source bench/results/run-helper.sh
call_begin ${CALL_S:-270}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
cpu_grid qwen3-split 215 qwen3-30b-a3b 4 128k --rounds 2 \
  --policies writescope,writescope@split_spilled=1,writescope@split_spilled=1@team_lock=0
row_summary qwen3-split
# the queue's tests on this host's AMX CPU, and the GPU tests of the steps the lock touches
run queue-tests 70 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -q \
  -p no:cacheprovider --tb=short -rf tests/test_cpu_job_queue.py tests/test_pipelined_experts.py \
  tests/test_graphs.py
grep -E "passed|failed" $R/queue-tests.log | tail -2
call_end
