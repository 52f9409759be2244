# 2026-12-04i call 2: the batch-1 CPU-experts chain on the host's clock too (the native queue's
# per-call times against the launching thread's): is the next call late because the launching
# thread had not queued it yet, or because its inputs had not landed? DeepSeek-V2-Lite 1 x 8K
# (with cProfile's functions) and Qwen3-30B-A3B 1 x 1K; DeepSeek with graphed CPU expert calls.
source bench/results/run-helper.sh
call_begin 420
P=bench/profiles/h200.json
chain() {  # NAME CAP MODEL CONTEXT [env...] -- [step_profile args...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  local envs=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  run $name $cap env "${envs[@]}" python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 1 --context $ctx --experts cpu \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup 6 --steps 12 --top 25 \
    --json $R/$name.json "$@"
}
chain ds-nap 130 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=0 -- --timeline --cprofile 3
chain ds-spin 100 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERT_SPIN_US=300 -- --timeline
chain q3-nap 110 qwen3-30b-a3b 1k WRITESCOPE_CPU_EXPERT_SPIN_US=0 -- --timeline
chain ds-graphed 100 deepseek-v2-lite 8k WRITESCOPE_CPU_EXPERTS_GRAPHED=1 --
grep -h -A1 "CPU expert chain" $R/*.log; grep -h "^decode step.*median" $R/*.log
call_end
