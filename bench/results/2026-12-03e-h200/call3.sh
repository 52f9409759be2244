#!/bin/bash
# Thirtieth session, call 3: the whole GPU suite on this session's code (resident steps now cut
# into graphs of 4 layers; each capture's warm-up runs on the eager step's inputs), the cut A/B
# again (DeepSeek-V2-Lite 4 x 32K resident, 0 and 4 layers, alternating), then issue 6's
# experts-on-GPU rows at 32K and 128K (the twenty-ninth session's flags) with the host-bound
# guard and the cut graphs: DeepSeek-V2-Lite and Qwen3-30B-A3B, and Mixtral at 32K if time is left.
source bench/results/run-helper.sh
call_begin 570
gpu_tests 180
P=bench/profiles/h200.json
A="--top 30 --steps 8 --warmup 3 --cprofile 0"
ds() { run ds4-32k-seg$1-$2 40 env WRITESCOPE_GRAPH_SEGMENT_LAYERS=$1 python -m writescope.bench.step_profile \
  --model deepseek-v2-lite --random-weights --profile $P --prefill synthetic --batch 4 --context 32k \
  --experts gpu --vram-budget 38GiB $A --json $R/ds4-32k-seg$1-$2.json; }
ds 0 a; ds 4 a; ds 0 b; ds 4 b
G="--random-weights --profile $P --experts gpu --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run dsv2-gpu 140 python -m writescope bench --model deepseek-v2-lite --vram-budget 38GiB --batch 4 --context-lengths 32k,128k $G --out $R/dsv2-gpu
run qwen3-gpu 160 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB --batch 2 --context-lengths 32k,128k $G --out $R/qwen3-gpu
run mixtral-32k 90 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB --batch 2 --context-lengths 32k $G --out $R/mixtral-32k
call_end
