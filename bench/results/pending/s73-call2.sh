#!/bin/bash
# Prepared in the seventy-third session (three starts refused; it never ran). Call 1's A/B put the
# DeepSeek-V2-Lite 4 x 8K spilled step at 16.7 ms on the new tree against 14.8 on 6b8dcb5 (one
# run each; Qwen3 28.0-29.1 against 27.8 twice). Alternating runs settle it, and one with
# WRITESCOPE_FAST_LAUNCH=0 (no kept-kernel or bound launches) tells the bound launches from
# the rest. Also the GPU tests call 1 failed (a test's own comparison). Needs _ab/old (see
# s73-call1.sh). Carry .whl. CALL_S=<seconds>.
source bench/results/run-helper.sh
call_begin ${CALL_S:-240}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
P=$PWD/bench/profiles/h200.json
prof() {  # prof NAME TREE MODEL [ENV=VALUE ...]
  local name=$1 tree=$2 model=$3; shift 3
  (cd $tree && run $name 50 env "$@" python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 4 --context 8k --experts gpu \
    --vram-budget 68GiB --num-gpu-blocks 128 --warmup 3 --steps 15 --json $R/$name.json)
  grep "^decode step" $R/$name.log | head -1 | cut -c1-120
}
for i in 1 2; do
  prof d-old-$i _ab/old deepseek-v2-lite X=0
  prof d-new-$i . deepseek-v2-lite X=0
done
prof d-nofast-1 . deepseek-v2-lite WRITESCOPE_FAST_LAUNCH=0
run gpu-tests-move 70 env WRITESCOPE_PROFILE=$P python -m pytest -m gpu -v -p no:cacheprovider \
  --tb=short -rf tests/test_expert_move.py tests/test_api_vllm_shape.py
grep -E "passed|failed" $R/gpu-tests-move.log | tail -2
prof d-old-3 _ab/old deepseek-v2-lite X=0
prof d-new-3 . deepseek-v2-lite X=0
prof q-old-3 _ab/old qwen3-30b-a3b X=0
prof q-new-3 . qwen3-30b-a3b X=0
prof d-nofast-2 . deepseek-v2-lite WRITESCOPE_FAST_LAUNCH=0
call_end
