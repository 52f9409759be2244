#!/bin/bash
# Thirteenth session, call 4: the GPU tests of the session's tree again, with room (call 3's
# 125 s cap killed ptxas in the last test's Triton compile: 141 passed, that one cut).
source bench/results/run-helper.sh
call_begin 290
gpu_tests 270
call_end
