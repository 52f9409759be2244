#!/bin/bash
# Sixty-sixth session, call 2 (one call for what was planned as two: two refused starts cost
# 270 s of the session's device time). In order of need:
# 1. The whole GPU suite on this session's tree (attention/hybrid.py split into groups.py and
#    hybrid_cpu.py, kvcache/resident_steps.py, engine/sizing.py, the GPU attention bench's
#    modules).
# 2. Issue 6's Qwen3-30B-A3B 1 x 1K batch-1 row (every routed expert on the CPU, all KV in HBM,
#    so no CPU attention) with the CPU experts' team at its default size (14 of 16 cores: two
#    reserved) against 15 and 16 threads, policy variants alternating in two rounds in one
#    process. Call 1 ran the row at 0.80-0.82 of the bound, the row's read probe at 80-85 GB/s
#    against the calibration's 93.5.
# 3. Issue 8's table on this host (`bench.cpu_attention`, 16 threads), if time is left.
# Carry .whl. CALL_S=585 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-585}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
gpu_tests 430
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
calibrate_profile 30
run q-threads 120 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
  --decode-steps 24 --prefill synthetic --no-progress --rounds 2 --batch 1 --context-lengths 1k \
  --policies writescope,writescope@expert_threads=15,writescope@expert_threads=16 \
  --out $R/q-threads
row_summary q-threads
run cpu-attn 110 python -m writescope.bench.cpu_attention --json $R/cpu_attention.json
tail -12 $R/cpu-attn.log
call_end
