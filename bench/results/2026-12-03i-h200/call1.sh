#!/bin/bash
# Thirty-fourth session, call 1: the full GPU suite on the thirty-third session's final tree
# (its unseeded sampled overlap and the gpu_experts smoke test had not run on a GPU).
source bench/results/run-helper.sh
call_begin 230
gpu_tests 200
call_end
