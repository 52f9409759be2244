#!/bin/bash
# Seventy-second session, the short call (the full call1 was refused eight times, leaving too
# little device time for it): on one host,
# 1. the attention launches' Python a call (bench.launch_host, no GPU needed);
# 2. the GPU tests of the modules this session's launch changes touch (bound partials, merge and
#    flag-wait launches; launch flags and pinned views per step): the GPU attention kernels and
#    the hybrid step, dependent launches, the merges, the processors on CUDA, the end-to-end
#    parity runs (cap 200 s);
# 3. a spilled eager step's host time, new then old (6b8dcb5 in _ab/old): step_profile of
#    Qwen3-30B-A3B 4 x 8K, experts on the GPU, 128 GPU blocks, 9 unprofiled steps each.
# Carry .whl. CALL_S=420 (timeout 450).
source bench/results/run-helper.sh
call_begin ${CALL_S:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
(cd _ab/old && python -m writescope.bench.provenance) > $R/provenance-old.txt 2>&1
run launch-host 30 python -m writescope.bench.launch_host --calls 10000 --json $R/launch_host.json
run gpu-tests 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_gpu_attention.py \
  tests/test_pdl.py tests/test_selfmerge.py tests/test_resident_merge.py \
  tests/test_resident_write.py tests/test_logits_processors.py tests/test_gpu_e2e.py
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -6
P=$PWD/bench/profiles/h200.json
prof() {  # prof NAME TREE MODEL [ARGS...]
  local name=$1 tree=$2 model=$3; shift 3
  (cd $tree && run $name 70 python -m writescope.bench.step_profile --model $model \
    --random-weights --profile $P --prefill synthetic --batch 4 --context 8k --experts gpu \
    --vram-budget 68GiB --num-gpu-blocks 128 --warmup 3 --steps 9 --json $R/$name.json "$@")
  grep "^decode step" $R/$name.log | head -1
}
prof q-new-1 . qwen3-30b-a3b --cprofile 4
prof q-old-1 _ab/old qwen3-30b-a3b
call_end
