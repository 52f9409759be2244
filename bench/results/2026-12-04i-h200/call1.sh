# 2026-12-04i call 1: where the batch-1 CPU-experts step goes between the CPU kernels
# (bench.step_profile --timeline: the device's own work between calls, the calls' spans, their
# kernels, the hand-off), DeepSeek-V2-Lite 1 x 8K and Qwen3-30B-A3B 1 x 1K, the queue thread
# napping (default) and spinning 300 us on each ready word before its naps.
source bench/results/run-helper.sh
call_begin 540
P=bench/profiles/h200.json
chain() {  # NAME CAP MODEL CONTEXT [env...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap env "$@" python -m writescope.bench.step_profile --model $model --random-weights \
    --profile $P --prefill synthetic --batch 1 --context $ctx --experts cpu --vram-budget 32GiB \
    --max-num-batched-tokens 16384 --warmup 6 --steps 12 --top 25 --timeline --json $R/$name.json
}
chain ds-nap 110 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0
chain ds-spin 110 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=300
chain q3-nap 120 qwen3-30b-a3b 1k WRITESCOPE_CPU_EXPERT_SPIN_US=0
chain q3-spin 120 qwen3-30b-a3b 1k WRITESCOPE_CPU_EXPERT_SPIN_US=300
grep -h "CPU expert chain\|^decode step" $R/*.log
call_end
