#!/bin/bash
# Sixty-third session: overlapped decode steps with graphed CPU expert calls (engine/inflight.py,
# layers/cpu_experts_graph.py). Carry .whl (see call1-full-suite.sh). An H100 or an H200.
# 1. The GPU tests of the modules it touches (overlap, graphs, CPU experts, the link).
# 2. `writescope bench` under the defaults (bench_row), overlap on (the default) against
#    WRITESCOPE_ASYNC_DECODE=0, alternating (odd rounds overlapped first): Qwen3-30B-A3B FP8
#    4 x 8K kv auto, two rounds, then DeepSeek-V2-Lite bf16 4 x 32K kv auto, one round.
# CALL_S=540 (timeout 600).
source bench/results/run-helper.sh
call_begin ${CALL_S:-540}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $R/gpu.txt
run gpu-tests 200 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60 tests/test_inflight.py \
  tests/test_graphs.py tests/test_cpu_experts.py tests/test_expert_link.py tests/test_cpu_job_queue.py
grep -E "passed|failed|^FAILED|^ERROR" $R/gpu-tests.log | tail -8
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
ovl() { bench_row $1-ovl-$2 $3 $4 $5 "${@:6}"; }
syn() { (export WRITESCOPE_ASYNC_DECODE=0; bench_row $1-sync-$2 $3 $4 $5 "${@:6}"); }
for r in 1 2; do
  if [ $r = 1 ]; then ovl q $r 60 qwen3-30b-a3b 8k --config-override "$Q"; syn q $r 60 qwen3-30b-a3b 8k --config-override "$Q"
  else syn q $r 60 qwen3-30b-a3b 8k --config-override "$Q"; ovl q $r 60 qwen3-30b-a3b 8k --config-override "$Q"; fi
done
ovl ds 1 80 deepseek-v2-lite 32k
syn ds 1 80 deepseek-v2-lite 32k
for f in $(ls -d $R/*-ovl-* $R/*-sync-* 2>/dev/null | xargs -n1 basename); do
  [ -f $R/$f/results.json ] && python - $f $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["rows"][0]
print(sys.argv[1], "tok/s %.1f mean %.2f p50 %.2f ms eff %.3f split %s overlapped %s expert_s %s" % (
    r["decode_tokens_per_s"], 1e3 * r["mean_step_s"], 1e3 * r["p50_step_s"],
    r.get("bound_efficiency") or 0, r.get("pipelined_steps"), r.get("overlapped_steps"),
    None if r.get("cpu_expert_s_mean") is None else round(1e3 * r["cpu_expert_s_mean"], 2)))
PY
done
call_end
