#!/bin/bash
# Twenty-eighth session, call 1: the GPU tests of this session's code (decode steps whose cached
# KV is all on the GPU attend through fixed buffers and are captured whole: attention/resident.py;
# and the twenty-seventh session's HybridAttention worker change, never run on the device), then
# where a Qwen3-30B-A3B decode step's host time goes, with and without the resident steps:
# batch 2 at 32K with the experts on the GPU (host-bound, 0.18-0.42 of the bound in the
# twenty-seventh session's grid) and batch 1 at 1K with the experts on the CPU (0.52-0.61).
source bench/results/run-helper.sh
call_begin 575
gpu_tests 150
calibrate_profile
host_profile q2-32k-gpu 110 2 32k gpu 68GiB
export WRITESCOPE_RESIDENT_ATTENTION=0
host_profile q2-32k-gpu-off 110 2 32k gpu 68GiB
unset WRITESCOPE_RESIDENT_ATTENTION
host_profile q1-1k-cpu 110 1 1k cpu 32GiB
call_end
