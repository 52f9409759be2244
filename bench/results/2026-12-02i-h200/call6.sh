#!/bin/bash
# Twenty-fourth session, call 6: the GPU tests on the session's last code (the sources/deferred
# split of the pipelined step as one method).
source bench/results/run-helper.sh
call_begin 200
gpu_tests 170
call_end
