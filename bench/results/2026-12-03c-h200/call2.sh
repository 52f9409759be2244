#!/bin/bash
# Twenty-eighth session, call 2 (back to back with call 1, same machine): where a Qwen3-30B-A3B
# decode step's host time goes -- batch 1 at 1K with the experts on the CPU (the grid's 0.52-0.61
# rows: ~0.45 ms a layer that is neither the experts nor the GPU's work) and batch 2 at 32K with
# the experts on the GPU (host-bound, 0.18-0.42 of the bound) -- then placement's margin A/B
# again, two more rounds in a new process on the same host.
source bench/results/run-helper.sh
call_begin 560
calibrate_profile
host_profile q1-1k-cpu 130 1 1k cpu 32GiB
host_profile q2-32k-gpu 130 2 32k gpu 68GiB
margin_ab margin-ab2 300
call_end
