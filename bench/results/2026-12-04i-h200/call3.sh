# 2026-12-04i call 3: graphed CPU expert calls (WRITESCOPE_CPU_EXPERTS_GRAPHED=1: the device's
# half of each call in the step's graphs, resident steps whole) against eager calls, processes
# alternating: DeepSeek-V2-Lite 1 x 8K and Qwen3-30B-A3B 1 x 1K (E G G E), DeepSeek 4 x 8K and
# a spilled DeepSeek 2 x 16K (64 GPU blocks: CPU attention beside the experts).
source bench/results/run-helper.sh
call_begin 560
P=bench/profiles/h200.json
ab() {  # NAME CAP GRAPHED MODEL BATCH CONTEXT [step_profile args...]
  local name=$1 cap=$2 g=$3 model=$4 b=$5 ctx=$6; shift 6
  run $name $cap env WRITESCOPE_CPU_EXPERTS_GRAPHED=$g python -m writescope.bench.step_profile \
    --model $model --random-weights --profile $P --prefill synthetic --batch $b --context $ctx \
    --experts cpu --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup 5 --steps 10 \
    --top 12 --json $R/$name.json "$@"
}
ab ds1-e1 60 0 deepseek-v2-lite 1 8k --timeline
ab ds1-g1 60 1 deepseek-v2-lite 1 8k
ab ds1-g2 60 1 deepseek-v2-lite 1 8k
ab ds1-e2 60 0 deepseek-v2-lite 1 8k --timeline
ab q1-e1 70 0 qwen3-30b-a3b 1 1k --timeline
ab q1-g1 70 1 qwen3-30b-a3b 1 1k
ab q1-g2 70 1 qwen3-30b-a3b 1 1k
ab q1-e2 70 0 qwen3-30b-a3b 1 1k --timeline
ab ds4-g 60 1 deepseek-v2-lite 4 8k
ab ds4-e 60 0 deepseek-v2-lite 4 8k
ab dsx-e 70 0 deepseek-v2-lite 2 16k --num-gpu-blocks 64 --timeline
ab dsx-g 70 1 deepseek-v2-lite 2 16k --num-gpu-blocks 64
grep -H "^decode step.*median" $R/*.log | sed 's/{.*resident_steps.: \([0-9]*\).*/resident \1/'
call_end
