#!/bin/bash
# Issue 6's DeepSeek-V2-Lite 1 x 8K batch-1 row (every expert on the CPU), the native queue's
# thread spinning 200 us on each call's ready word before its 20 us naps
# (WRITESCOPE_CPU_EXPERT_SPIN_US=200) against the default (256 pauses, then naps), alternating,
# on a fresh host: the sixty-fifth session's call 3 could not tell (its first two rows, one of
# each, ran at half the speed of its third). Carry .whl. CALL_S=230 (timeout 290).
source bench/results/run-helper.sh
call_begin ${CALL_S:-230}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 30
batch1_row d-spin-1 50 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=200
batch1_row d-nap-1 50 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0
batch1_row d-nap-2 50 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0
batch1_row d-spin-2 50 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=200
row_summary d-spin-1 d-nap-1 d-nap-2 d-spin-2
call_end
