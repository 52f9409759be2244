#!/bin/bash
# --kv-cache-memory auto after the fit (fifty-seventh session): the engine moves the next MoE
# layers' routed experts to the CPU when the activations it measured leave the KV less than the
# split asked for (layers/expert_move.py, LLMEngine._fit_experts_around_kv). The session's
# call 1 (bench/results/2026-12-05h-h100/call1) ran the same rows before the fit: the G region
# got 74-253 blocks fewer than the split planned (activations of 1.7-2.8 GiB against a 1.6 GiB
# margin), so some KV streamed and the steps ran eagerly. Same rows, both ways, on one host;
# first the new GPU tests. Carry .whl as in call1-full-suite.sh.
source bench/results/run-helper.sh
call_begin ${CALL_S:-580}
run gpu-move 120 python -m pytest -m gpu -v -p no:cacheprovider --tb=short -rf tests/test_expert_move.py
grep -E "passed|failed|^FAILED" $R/gpu-move.log | tail -4
calibrate_profile 50
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
row() {  # NAME CAP CONTEXT [bench args...]
  local name=$1 cap=$2 ctx=$3; shift 3
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto "$@" --out $R/$name
}
for ctx in 8k 32k; do
  row fp8-$ctx-kvauto 110 $ctx --config-override "$Q" --kv-cache-memory auto
  row fp8-$ctx-auto 110 $ctx --config-override "$Q"
done
row bf16-8k-kvauto 80 8k --kv-cache-memory auto
row bf16-8k-auto 80 8k
grep -h "built in\|tok/s" $R/*.log
call_end
