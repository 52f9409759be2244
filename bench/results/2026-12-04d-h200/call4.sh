#!/bin/bash
# Thirty-ninth session, call 4: the GPU test suite on the session's final package (the CPU
# attention team's new size on GPU hosts, the AVX-512 BF16 kernel's T path), then the CPU
# attention kernel's tests on this host's Xeon (every ISA, AMX and the AVX-512 BF16 forms
# included, both layouts).
source bench/results/run-helper.sh
call_begin 430
gpu_tests 290
run cpu-kernel-tests 90 python -m pytest -q -p no:cacheprovider --tb=short tests/test_cpu_attention.py
call_end
