#!/bin/bash
# bf16 `--kv-cache-memory auto` at the lengths the fifty-seventh session did not reach (fifty-
# eighth session). With that session's call-4 calibration the plan predicts, for Qwen3-30B-A3B
# bf16 under 32 GiB at batch 4: 4 x 64K, 252.6 ms with `--experts auto` (29 of 48 layers on the
# CPU) against 146.5 ms with 45 of 48 (1.73x, `--kv-cache-memory 24734MiB`); 4 x 128K, 399.1 ms
# (35 of 48) against 281.9 ms with every layer's experts on the CPU (1.42x, `--experts cpu`).
# The `plans.txt` lines give the prediction with this call's calibration. Carry .whl as in
# call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
calibrate_profile 50
row() {  # NAME CAP CONTEXT [bench args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 16 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    "$@" --out $R/$name
}
for ctx in 64k 128k; do
  python -m writescope plan --model qwen3-30b-a3b --profile $P --vram-budget 32GiB --batch 4 \
    --context-lengths $ctx --experts auto | tail -4 | tee -a $R/plans.txt
done
row bf16-64k-kvauto 130 64k --experts auto --kv-cache-memory auto
row bf16-64k-auto 130 64k --experts auto
row bf16-128k-kvauto 150 128k --experts auto --kv-cache-memory auto
row bf16-128k-auto 150 128k --experts auto
grep -h "built in\|tok/s" $R/*.log
call_end
