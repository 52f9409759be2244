#!/bin/bash
# Prepared in the seventy-second session (twelve starts refused; it never ran): the attention
# launches with their named arguments bound once (FastLaunch.bind) and the launch flags and
# pinned views read once per step, against the seventy-first's final tree 6b8dcb5. Before the
# call: `mkdir -p _ab/old && git archive 6b8dcb5 writescope | tar -x -C _ab/old` (untracked, not
# ignored, so the device gets it; removed after; never `git add -A` while it exists).
# 0. The attention launches' Python a call on this host (bench.launch_host, no GPU needed).
# 1. A spilled eager step's host time, new then old on one host: step_profile of Qwen3-30B-A3B
#    4 x 8K, experts on the GPU, 128 GPU blocks (the seventy-first's row: 48.0 ms, the launching
#    thread 46.6 ms), 9 unprofiled steps each; the new row with --cprofile 4.
# 2. The whole GPU suite on the new tree (cap 400 s, or what the call has left).
# 3. Time allowing: old then new again, and DeepSeek-V2-Lite 4 x 8K (MLA), new / old.
# Carry .whl. CALL_S=560 (timeout 590).
source bench/results/run-helper.sh
call_begin ${CALL_S:-560}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
(cd _ab/old && python -m writescope.bench.provenance) > $R/provenance-old.txt 2>&1
P=$PWD/bench/profiles/h200.json
prof() {  # prof NAME TREE MODEL [ARGS...]
  local name=$1 tree=$2 model=$3; shift 3
  (cd $tree && run $name 70 python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 4 --context 8k --experts gpu \
    --vram-budget 68GiB --num-gpu-blocks 128 --warmup 3 --steps 9 --json $R/$name.json "$@")
  grep "^decode step" $R/$name.log | head -1
}
run launch-host 40 python -m writescope.bench.launch_host --json $R/launch_host.json
prof q-new-1 . qwen3-30b-a3b --cprofile 4
prof q-old-1 _ab/old qwen3-30b-a3b
left=$((DEADLINE - $(date +%s)))
gpu_tests $(( left - 20 < 400 ? left - 20 : 400 ))
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
prof q-old-2 _ab/old qwen3-30b-a3b
prof q-new-2 . qwen3-30b-a3b
prof d-new-1 . deepseek-v2-lite
prof d-old-1 _ab/old deepseek-v2-lite
for f in q-new-1 q-old-1 q-old-2 q-new-2 d-new-1 d-old-1; do
  echo "$f: $(grep '^decode step' $R/$f.log | head -1 | cut -c1-160)"
done
call_end
