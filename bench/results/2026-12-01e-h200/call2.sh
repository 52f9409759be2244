#!/bin/bash
# Next session, call 2: issue 6's experts-on-GPU runs with ~8 GB of KV in HBM, now that
# experts='gpu' no longer asks the budget for one sequence's KV (the tenth session's 70/100 GiB
# runs were refused and ran at 74/109 GiB with 15/19 GB of KV in HBM; weights, activations and
# staging left 3.4/4.2 GB beside G there, so 68/98 GiB should give G ~8 GB): Qwen3-30B-A3B and
# Mixtral-8x7B at 2 x 128K, writescope, transfer, cpu and static (static was 6% ahead of
# writescope there, with the same C placement).
source bench/results/run-helper.sh
call_begin 560
P=bench/profiles/h200.json
G="--random-weights --profile $P --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --policies writescope,transfer,cpu,static"
run qwen3-gpu 250 python -m writescope bench --model qwen3-30b-a3b --vram-budget 68GiB $G --out $R/qwen3-gpu
run mixtral-gpu 280 python -m writescope bench --model mixtral-8x7b --vram-budget 98GiB $G --out $R/mixtral-gpu
call_end
