#!/bin/bash
# (recorded copy: diag_overlap.py was in bench/results/pending/ when this ran)
# Sixty-fourth session: overlapped decode steps at batch 1 with every routed expert on the CPU
# ran 1.6-1.7x slower than synchronous ones (call 2: DeepSeek-V2-Lite 1 x 8K 54.9 against 35.2 ms,
# Qwen3-30B-A3B 1 x 1K 143.9 against 84.9). diag_overlap.py splits the steps: the native calls'
# kernel and ready-wait times, each thread's CPU seconds, steal. Then the GPU tests of the
# modules the block-completing resident steps touch. Carry .whl. CALL_S=420.
source bench/results/run-helper.sh
call_begin ${CALL_S:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
P=bench/profiles/h200.json
D="python bench/results/2026-12-06d-h100/diag_overlap.py --profile $P"
run d-sync 60 env WRITESCOPE_ASYNC_DECODE=0 $D --json $R/d-sync.json
run d-ovl 60 env WRITESCOPE_ASYNC_DECODE=auto $D --json $R/d-ovl.json
run d-ovl-t12 60 env WRITESCOPE_ASYNC_DECODE=auto WRITESCOPE_CPU_EXPERT_THREADS=12 $D --json $R/d-ovl-t12.json
run d-sync-t12 60 env WRITESCOPE_ASYNC_DECODE=0 WRITESCOPE_CPU_EXPERT_THREADS=12 $D --json $R/d-sync-t12.json
run q-ovl 70 env WRITESCOPE_ASYNC_DECODE=auto $D --model qwen3-30b-a3b --context 1024 --json $R/q-ovl.json
run q-sync 70 env WRITESCOPE_ASYNC_DECODE=0 $D --model qwen3-30b-a3b --context 1024 --json $R/q-sync.json
for f in d-sync d-ovl d-ovl-t12 d-sync-t12 q-ovl q-sync; do echo "== $f"; head -c 1500 $R/$f.log | grep '^{' | head -1; done
run gpu-sel 200 env WRITESCOPE_PROFILE=$PWD/$P python -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf \
  tests/test_graphs.py tests/test_inflight.py tests/test_pipelined_experts.py tests/test_parity.py
grep -E "passed|failed|^FAILED" $R/gpu-sel.log | tail -6
call_end
