#!/bin/bash
# Twenty-second session, call 4 (84af7b1's tree, `18414026`): the CPU attention kernel at the
# size of one DeepSeek-V2-Lite 4 x 128K layer call in the engine (4 x 112K tokens of MLA KV,
# past the L3), flagged calls as the engine makes them (the team spinning up to 2 ms), alone and
# beside the H2D copies, 14 and 16 threads -- the engine's rows read 48-58 GB/s, the bench's
# hybrid steps 67-88.
source bench/results/run-helper.sh
call_begin 200
run cpu-contention 150 env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=1 python -m writescope.bench.cpu_contention \
  --size 4x112K --threads 14,16 --spinners 0 --dma --reps 20 --spin-us 2000 --json $R/cpu_contention.json
call_end
