#!/bin/bash
# Seventy-fourth session, call 1. The whole GPU suite on the current tree (the seventy-third's
# test_expert_move fix has not run on a GPU; the sampler now ranks sampled tokens), then the
# seventy-third's unsettled A/B
# (s73-call2.sh, which never ran): a DeepSeek-V2-Lite 4 x 8K spilled step, the old tree
# (6b8dcb5, before the bound launches) against the new, alternating, and the new tree with
# WRITESCOPE_FAST_LAUNCH=0 (no kept-kernel or bound launches); then a Qwen3 pair. run() skips
# what the deadline leaves no room for. Needs _ab/old:
#   mkdir -p _ab/old && git archive 6b8dcb5 writescope | tar -x -C _ab/old
# Carry .whl. CALL_S=<seconds>.
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
(cd _ab/old && python -m writescope.bench.provenance) > $R/provenance-old.txt 2>&1
gpu_tests 420
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
P=$PWD/bench/profiles/h200.json
prof() {  # prof NAME TREE MODEL [ENV=VALUE ...]
  local name=$1 tree=$2 model=$3; shift 3
  (cd $tree && run $name 45 env "$@" python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 4 --context 8k --experts gpu \
    --vram-budget 68GiB --num-gpu-blocks 128 --warmup 3 --steps 15 --json $R/$name.json)
  grep "^decode step" $R/$name.log | head -1 | cut -c1-120
}
for i in 1 2 3; do
  prof d-old-$i _ab/old deepseek-v2-lite X=0
  prof d-new-$i . deepseek-v2-lite X=0
  prof d-nofast-$i . deepseek-v2-lite WRITESCOPE_FAST_LAUNCH=0
done
prof q-old-1 _ab/old qwen3-30b-a3b X=0
prof q-new-1 . qwen3-30b-a3b X=0
call_end
