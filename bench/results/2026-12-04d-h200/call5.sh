#!/bin/bash
# Thirty-ninth session, call 5 (the session's last 251 s of device time): the final package's
# CPU attention kernel tests on the H200 host's Xeon (the AVX-512 BF16 kernel's final T path,
# every ISA, both layouts), the GPU test fixed after call 4, and the hybrid GPU tests.
source bench/results/run-helper.sh
call_begin 150
run cpu-kernel-tests 70 python -m pytest -q -p no:cacheprovider --tb=short tests/test_cpu_attention.py
run gpu-threads-test 30 python -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/test_gpu_attention.py -k engines_threads
run gpu-hybrid-tests 60 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/test_gpu_attention.py -k hybrid
call_end
