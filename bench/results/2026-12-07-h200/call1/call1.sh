#!/bin/bash
# Seventy-third session: the seventy-second's prepared call (s72-call1.sh) with the GPU suite
# first, for a session whose device budget was spent on refused starts (a smaller CALL_S still
# runs the suite whole). Before the call: `mkdir -p _ab/old && git archive 6b8dcb5 writescope |
# tar -x -C _ab/old` (untracked, not ignored, so the device gets it; removed after).
# 1. The whole GPU suite on the new tree (cap CALL_S - 170 s, at most 400).
# 2. A spilled eager step's host time, new then old on one host: step_profile of Qwen3-30B-A3B
#    4 x 8K, experts on the GPU, 128 GPU blocks (the seventy-first's row: 48.0 ms, the launching
#    thread 46.6 ms), 9 unprofiled steps each; the new row with --cprofile 4.
# 3. Time allowing: bench.launch_host on this host; old then new again; DeepSeek-V2-Lite 4 x 8K.
# Carry .whl. CALL_S=<seconds> (timeout CALL_S + 30).
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
cap=$(( ${CALL_S:-560} - 170 )); [ $cap -gt 400 ] && cap=400
gpu_tests $cap
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
prof q-new-1 . qwen3-30b-a3b --cprofile 4
prof q-old-1 _ab/old qwen3-30b-a3b
run launch-host 40 python -m writescope.bench.launch_host --json $R/launch_host.json
prof q-old-2 _ab/old qwen3-30b-a3b
prof q-new-2 . qwen3-30b-a3b
prof d-new-1 . deepseek-v2-lite
prof d-old-1 _ab/old deepseek-v2-lite
for f in q-new-1 q-old-1 q-old-2 q-new-2 d-new-1 d-old-1; do
  [ -f $R/$f.log ] && echo "$f: $(grep '^decode step' $R/$f.log | head -1 | cut -c1-160)"
done
call_end
