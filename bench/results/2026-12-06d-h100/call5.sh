#!/bin/bash
# Sixty-fourth session: the overlapped path waited for a step's tokens with a spinning CUDA
# event, a 16th busy thread beside the CPU experts' team of 14 and the queue's thread (call 2:
# batch-1 rows 1.6-1.7x slower overlapped). Now it sleeps (attention/hostflag.host_event).
# Issue 6's batch-1 rows (experts on the CPU, as call4-batch1.sh): overlapped (the default),
# synchronous, and overlapped with WRITESCOPE_BLOCKING_SYNC=0 (every host wait spins again: the
# old overlapped wait); then the Qwen3 FP8 4 x 8K kv auto row that overlap sped up 1.35x in the
# sixty-third session, overlapped. Carry .whl. CALL_S=440 (timeout 500).
source bench/results/run-helper.sh
call_begin ${CALL_S:-440}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
b1() {  # NAME CAP MODEL CONTEXT [env...]
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap env "$@" python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --policies writescope --batch 1 \
    --context-lengths $ctx --out $R/$name
}
b1 d1-8k-ovl 70 deepseek-v2-lite 8k WRITESCOPE_ASYNC_DECODE=auto
b1 d1-8k-sync 70 deepseek-v2-lite 8k WRITESCOPE_ASYNC_DECODE=0
b1 d1-8k-ovl-spin 70 deepseek-v2-lite 8k WRITESCOPE_ASYNC_DECODE=auto WRITESCOPE_BLOCKING_SYNC=0
b1 q1-1k-ovl 95 qwen3-30b-a3b 1k WRITESCOPE_ASYNC_DECODE=auto
b1 q1-1k-sync 95 qwen3-30b-a3b 1k WRITESCOPE_ASYNC_DECODE=0
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
bench_row q4-8k-ovl 90 qwen3-30b-a3b 8k --config-override "$Q"
for f in d1-8k-ovl d1-8k-sync d1-8k-ovl-spin q1-1k-ovl q1-1k-sync q4-8k-ovl; do
  [ -f $R/$f/results.json ] && python - $f $R/$f/results.json <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))["rows"][0]
t = r.get("threads_decode") or {}
main = [x for x in t.get("top", []) if x.get("name") == "MainThread"]
print(sys.argv[1], "tok/s %.1f mean %.2f p50 %.2f ms bound %.2f eff %.3f overlapped %s expert_s %s main_frac %s" % (
    r["decode_tokens_per_s"], 1e3 * r["mean_step_s"], 1e3 * r["p50_step_s"],
    1e3 * (r.get("roofline_bound_s") or 0), r.get("bound_efficiency") or 0, r.get("overlapped_steps"),
    None if r.get("cpu_expert_s_mean") is None else round(1e3 * r["cpu_expert_s_mean"], 2),
    main[0]["frac"] if main else None))
PY
done
call_end
