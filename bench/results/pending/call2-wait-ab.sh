#!/bin/bash
# Sixty-fourth session's open question: does waiting for an overlapped step's tokens sleeping
# (a blocking-sync event, the default since 2bf2056) cost the batch-4 split steps anything?
# Qwen3-30B-A3B FP8 4 x 8K kv auto under the defaults (`bench_row`; 278.6 tok/s on the
# sixty-fourth's call-5 host, 305.0 / 297.7 on the sixty-third's, both recomputed without the
# first timed call) against WRITESCOPE_BLOCKING_SYNC=0 (every host wait spins), alternating on
# one host, then DeepSeek-V2-Lite 1 x 8K with every expert on the CPU the same way (where the
# spinning wait made overlapped steps 1.6x slower in the sixty-fourth's call 2), and
# DeepSeek-V2-Lite bf16 4 x 32K kv auto under the defaults (overlapped 148.1 tok/s against 146.3
# synchronous in the sixty-third's call 2, recomputed: its overlapped steps waited spinning
# beside a team that runs most of the step). Carry .whl. CALL_S=570 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-570}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
row() { bench_row q-$1 70 qwen3-30b-a3b 8k --config-override "$Q"; }
for r in sleep-1 spin-1 spin-2 sleep-2; do
  export WRITESCOPE_BLOCKING_SYNC=$([ ${r%-*} = sleep ] && echo 1 || echo 0)
  row $r
done
unset WRITESCOPE_BLOCKING_SYNC
batch1_row d-sleep 60 deepseek-v2-lite 8k WRITESCOPE_BLOCKING_SYNC=1
batch1_row d-spin 60 deepseek-v2-lite 8k WRITESCOPE_BLOCKING_SYNC=0
# the native queue's thread spinning 200 us on each call's ready word before its 20 us naps (the
# default 0: 256 pauses; each batch-1 DeepSeek step waits ~0.1 ms for 26 ready words)
batch1_row d-sleep-qspin 60 deepseek-v2-lite 8k WRITESCOPE_BLOCKING_SYNC=1 \
  WRITESCOPE_CPU_EXPERT_SPIN_US=200
for r in sleep spin; do
  export WRITESCOPE_BLOCKING_SYNC=$([ $r = sleep ] && echo 1 || echo 0)
  bench_row ds-$r 80 deepseek-v2-lite 32k
done
unset WRITESCOPE_BLOCKING_SYNC
row_summary q-sleep-1 q-spin-1 q-spin-2 q-sleep-2 d-sleep d-spin d-sleep-qspin ds-sleep ds-spin
call_end
