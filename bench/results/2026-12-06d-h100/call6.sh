#!/bin/bash
# Sixty-fourth session, the final tree: issue 6's batch-1 rows (experts on the CPU) overlapped
# against synchronous, now that graphs are captured again after every graph was dropped (call 5:
# DeepSeek-V2-Lite 1 x 8K ran eagerly, the allocator's use_count assert) and overlapped steps
# wait sleeping; then the whole GPU suite with the time left. Carry .whl. CALL_S=500.
source bench/results/run-helper.sh
call_begin ${CALL_S:-500}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
b1() {  # NAME CAP MODEL CONTEXT [env...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap env "$@" python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --policies writescope --batch 1 \
    --context-lengths $ctx --out $R/$name
}
b1 d1-8k-ovl 60 deepseek-v2-lite 8k WRITESCOPE_ASYNC_DECODE=auto
b1 d1-8k-sync 60 deepseek-v2-lite 8k WRITESCOPE_ASYNC_DECODE=0
b1 q1-1k-sync 70 qwen3-30b-a3b 1k WRITESCOPE_ASYNC_DECODE=0
b1 q1-1k-ovl 70 qwen3-30b-a3b 1k WRITESCOPE_ASYNC_DECODE=auto
for f in d1-8k-ovl d1-8k-sync q1-1k-sync q1-1k-ovl; do
  grep -l "capture failed" $R/$f.log
  [ -f $R/$f/results.json ] && python - $f $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["rows"][0]
t = r.get("threads_decode") or {}
main = [x for x in t.get("top", []) if x.get("name") == "MainThread"]
print(sys.argv[1], "tok/s %.1f mean %.2f p50 %.2f ms bound %.2f eff %.3f overlapped %s expert_s %s main_frac %s host_attend %s" % (
    r["decode_tokens_per_s"], 1e3 * r["mean_step_s"], 1e3 * r["p50_step_s"],
    1e3 * (r.get("roofline_bound_s") or 0), r.get("bound_efficiency") or 0, r.get("overlapped_steps"),
    None if r.get("cpu_expert_s_mean") is None else round(1e3 * r["cpu_expert_s_mean"], 2),
    main[0]["frac"] if main else None, (r.get("last_step_timing") or {}).get("host_attend_s")))
PY
done
gpu_tests 320
grep -E "passed|failed|^FAILED" $R/gpu-tests.log | tail -8
call_end
