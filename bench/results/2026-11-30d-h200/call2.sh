#!/bin/bash
# Call 2: the new AMX kernel (its tests; if they fail, the previous kernel is put back for the
# rest of the call), GPU tests with the pipelined decode, the 32K rows with the pipelined decode
# (writescope, transfer) and without it (WRITESCOPE_PIPELINE=0), then the CPU kernel bench, new
# kernel against the previous one, same call. attn_amx_prev.cpp was made before the call with
#   git show b88a74f:writescope/attention/csrc/attn_amx.cpp > bench/results/2026-11-30d-h200/attn_amx_prev.cpp
# (and is not kept in the repository: git has it).
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
D=bench/results/2026-11-30d-h200
K=writescope/attention/csrc/attn_amx.cpp
cp $K $R/attn_amx_new.cpp.txt
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
timeout 90 python -m pytest -q -p no:cacheprovider -x tests/test_cpu_attention.py \
  tests/test_cpu_attention_amx_emu.py > $R/cpu_attn_tests.log 2>&1
RC=$?; tail -2 $R/cpu_attn_tests.log
if [ $RC -ne 0 ]; then echo "AMX tests failed: previous kernel restored"; cp $D/attn_amx_prev.cpp $K; fi
WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json timeout 150 python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 > $R/gpu_tests.log 2>&1
tail -2 $R/gpu_tests.log
B="python -m writescope bench --model deepseek-v2-lite --random-weights --max-num-batched-tokens 4096 --decode-steps 32 --profile bench/profiles/h200.json --vram-budget 48GiB --experts gpu --num-gpu-blocks 128 --batch 4 --context-lengths 32k"
timeout 130 $B --policies writescope,transfer --out $R/pipe-32k > $R/pipe-32k.log 2>&1
tail -1 $R/pipe-32k.log
WRITESCOPE_PIPELINE=0 timeout 55 $B --policies writescope --out $R/nopipe-32k > $R/nopipe-32k.log 2>&1
tail -1 $R/nopipe-32k.log
C="python -m writescope.bench.cpu_attention --shapes mla-16/1/576 --reps 3 --torch-reps 0 --no-variants"
timeout 55 $C --json $R/cpu_attention_new.json > $R/cpu_attention_new.log 2>&1
tail -5 $R/cpu_attention_new.log
cp $D/attn_amx_prev.cpp $K
timeout 55 $C --json $R/cpu_attention_prev.json > $R/cpu_attention_prev.log 2>&1
tail -5 $R/cpu_attention_prev.log
cd $OUT && tar czf r.tgz r && rm -rf r
