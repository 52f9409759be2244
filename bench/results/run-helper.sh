# Shared by the device-call scripts: run NAME CAP_S COMMAND... runs COMMAND with a timeout of
# min(CAP_S, seconds left to $DEADLINE), its output in $R/NAME.log and host MemAvailable every
# 10 s in $R/NAME.mem.log; it prints the exit code, the bench's summary lines and the log's tail.
run() {
  local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - $(date +%s)))
  local t=$(( cap < left ? cap : left ))
  if [ $t -lt 20 ]; then echo "[$name] skipped: ${left} s left" | tee -a $R/skipped.txt; return; fi
  local s=$(date +%s)
  ( while sleep 10; do echo "$(( $(date +%s) - s )) s $(grep MemAvailable /proc/meminfo)"; done ) \
    > $R/$name.mem.log 2>&1 &
  local mon=$!
  # USR1 first: a writescope command prints every thread's stack (cli.py) before the KILL
  timeout -s USR1 -k 8 $t "$@" > $R/$name.log 2>&1
  local rc=$?
  kill $mon 2>/dev/null
  echo "[$name] rc=$rc after $(( $(date +%s) - s )) s (timeout $t s)"
  grep "\[bench\]" $R/$name.log | head -3
  tail -4 $R/$name.log
}

# call_begin SECONDS: the start every device-call script shares -- unbuffered output, a deadline
# SECONDS from now for run(), $R = $OUT/r for the logs, the project installed, the tree's
# provenance (the device's git HEAD is stale: the source digest names the tree). Wheels carried
# in .whl/ (the device has no registry: llguidance for structured outputs, jsonschema for its
# tests; see the device README's Notes) go to /tmp/site, on PYTHONPATH.
call_begin() {
  export PYTHONUNBUFFERED=1
  T0=$(date +%s); DEADLINE=$((T0 + $1))
  R=$OUT/r; mkdir -p $R
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl > $R/wheels.log 2>&1 && export PYTHONPATH=/tmp/site
  fi
  pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
  python -m writescope.bench.provenance > $R/provenance.txt 2>&1
}

# call_end: total time, and the logs packed into one file (the device returns at most 8 files).
call_end() {
  echo "total $(( $(date +%s) - T0 )) s"
  cd $OUT && tar czf r.tgz r && rm -rf r
}

# gpu_tests CAP: the GPU test suite (the command every issue note quotes), as run NAME gpu-tests;
# one line a test (-v, since 2026-12-05c: a run cut by its cap keeps which tests passed and
# failed; H100 machines took 206-401 s for it, the H200 210-260 s).
gpu_tests() {
  run gpu-tests $1 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -v \
    -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
}

# calibrate_profile [CAP]: `writescope calibrate` into $R/h200-profile.json (cap 60 s unless
# given); sets $P to it, or to the committed profile when the calibration failed. A fresh host's
# first Triton compiles can take most of a minute: 2026-12-07f-h200's call 2 ran past a 45 s
# cap (37 s on call 1's H100 host).
calibrate_profile() {
  run calibrate ${1:-60} python -m writescope calibrate --out $R/h200-profile.json
  P=$R/h200-profile.json; [ -s $P ] || P=bench/profiles/h200.json
}

# hybrid_table NAME CAP [ARGS...]: issue 9's spilled table (streamed and hybrid, both shapes in
# one run, one combined ceiling; 16 CPU threads at the calibrated AMX prefetch distance, shares
# around the balance the 2026-12-02 calls found -- 0.5-0.65: MLA's best was the lowest share
# swept, 0.55, in two runs of 2026-12-02g) into $R/NAME.json; ARGS are added (--skip "" for the
# resident rows too, --shapes, --shares to override). Seven timed steps per share, the median
# (until 2026-12-02h: --reps 2, whose "median" was the slower of the two); since 2026-12-04e
# seven steps without device timing events give the wall time and seven with them, in between,
# the breakdown (gpu_attention._run_steps). HYB_PF sets the AMX
# kernel's prefetch distance (default 1, the calibrations' choice on the H200).
hybrid_table() {
  local name=$1 cap=$2; shift 2
  run $name $cap env WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS=${HYB_PF:-1} python -m writescope.bench.gpu_attention \
    --reps 7 --cpu-threads 16 --shares 0,0.5,0.525,0.55,0.575,0.6,0.625,0.65,1 --skip resident \
    --json $R/$name.json "$@"
}

# dsv2_row NAME CAP [ARGS...]: issue 6's DeepSeek-V2-Lite 4 x 128K row with the experts on the
# GPU (38 GiB, synthetic prefill, 16 decode steps, two rounds) against $P (calibrate_profile
# first) into $R/NAME/; ARGS are added (--policies, --cpu-threads, ...).
dsv2_row() {
  local name=$1 cap=$2; shift 2
  run $name $cap python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
    --vram-budget 38GiB --experts gpu --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 \
    --warmup-length 4k --decode-steps 16 --prefill synthetic --no-progress --rounds 2 \
    --out $R/$name "$@"
}

# qwen3_row NAME CAP [ARGS...]: issue 6's Qwen3-30B-A3B 2 x 128K row with the experts on the GPU
# (68 GiB, synthetic prefill, 12 decode steps, two rounds) against $P (calibrate_profile first)
# into $R/NAME/; ARGS are added (--policies, --cpu-threads, ...). The command of 2026-12-02g
# call 2 and 2026-12-02h call 2.
qwen3_row() {
  local name=$1 cap=$2; shift 2
  run $name $cap python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
    --vram-budget 68GiB --experts gpu --batch 2 --context-lengths 128k --max-num-batched-tokens 16384 \
    --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
    --out $R/$name "$@"
}

# cpu_grid NAME CAP MODEL BATCHES CONTEXTS [ARGS...]: issue 6's experts-on-CPU grid for one model
# (32 GiB, all five policies, synthetic prefill, 12 decode steps, one round) against $P
# (calibrate_profile first) into $R/NAME/; ARGS are added. results.json is rewritten after every
# row, so a grid cut by its cap keeps the rows it finished.
cpu_grid() {
  local name=$1 cap=$2 model=$3 batches=$4 contexts=$5; shift 5
  run $name $cap env WRITESCOPE_STACKS_EVERY_S=150 python -m writescope bench --model $model \
    --random-weights --profile $P --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 \
    --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress \
    --policies writescope,transfer,cpu,static,migrate --batch $batches --context-lengths $contexts \
    --out $R/$name "$@"
}

# margin_ab NAME CAP [ARGS...]: placement's CPU margin, A/B in one process: DeepSeek-V2-Lite
# 4 x 128K with the experts on the GPU (38 GiB), writescope at the default PLACEMENT_CPU_MARGIN,
# static, and writescope at margins 1.2 and 1.0 (policy variants), two rounds of alternating
# order, against $P (calibrate_profile first) into $R/NAME/. ~30 s per policy-round after a
# ~20 s build. (The twenty-seventh session's rows needed 1.04-1.27 to cover the CPU's drift from
# the warm-up's correction to the long steps'.)
margin_ab() {
  local name=$1 cap=$2; shift 2
  run $name $cap python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
    --vram-budget 38GiB --experts gpu --batch 4 --context-lengths 128k --max-num-batched-tokens 16384 \
    --warmup-length 4k --decode-steps 12 --prefill synthetic --no-progress --rounds 2 \
    --policies writescope,static,writescope@placement_cpu_margin=1.2,writescope@placement_cpu_margin=1.0 \
    --out $R/$name "$@"
}

# host_profile NAME CAP BATCH CONTEXT EXPERTS BUDGET [ARGS...]: where a Qwen3-30B-A3B decode
# step's host time goes (bench.step_profile with --cprofile 4, synthetic prefill) into
# $R/NAME.json: e.g. 1 1k cpu 32GiB (the batch-1 CPU-experts step), 2 32k gpu 68GiB (the short
# host-bound step).
host_profile() {
  local name=$1 cap=$2 b=$3 ctx=$4 ex=$5 budget=$6; shift 6
  run $name $cap python -m writescope.bench.step_profile --model qwen3-30b-a3b --random-weights \
    --profile $P --prefill synthetic --cprofile 4 --batch $b --context $ctx --experts $ex \
    --vram-budget $budget --json $R/$name.json "$@"
}

# bench_row NAME CAP MODEL CONTEXT [bench args...]: one `writescope bench` row under the defaults
# the issue-6 rows use (random weights, $P's profile, a 32 GiB budget, batch 4, synthetic prefill,
# 24 timed decode steps, writescope, experts and KV memory auto) into $R/NAME/.
bench_row() {
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --max-num-batched-tokens 16384 --warmup-length 1k --decode-steps 24 \
    --prefill synthetic --no-progress --batch 4 --context-lengths $ctx --policies writescope \
    --experts auto --kv-cache-memory auto "$@" --out $R/$name
  grep -h "tok/s\|peak" $R/$name.log | tail -1
}

# batch1_row NAME CAP MODEL CONTEXT [VAR=value...]: issue 6's batch-1 row, every routed expert
# on the CPU (a 32 GiB budget, synthetic prefill, 24 timed decode steps, writescope) with the
# given environment, into $R/NAME/.
batch1_row() {
  local name=$1 cap=$2 model=$3 ctx=$4; shift 4
  run $name $cap env "$@" python -m writescope bench --model $model --random-weights --profile $P \
    --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
    --decode-steps 24 --prefill synthetic --no-progress --policies writescope --batch 1 \
    --context-lengths $ctx --out $R/$name
}

# row_summary NAME...: a line per row of each $R/NAME/results.json (tokens/s, step times, the
# bound's efficiency, overlapped and split steps, the CPU experts' ms a timed step, how busy the
# main thread was, the host's read probed before and after the decode steps).
row_summary() {
  local f
  for f in "$@"; do
    [ -f $R/$f/results.json ] && python - $f $R/$f/results.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[2]))["rows"]:
    if r.get("error"):
        print(sys.argv[1], "batch", r["batch"], "error:", r["error"])
        continue
    t = r.get("threads_decode") or {}
    main = [x["frac"] for x in t.get("top", []) if x.get("name") == "MainThread"]
    es = r.get("cpu_expert_s_mean")
    print(sys.argv[1], r.get("policy"), "round", r.get("round"),
          "batch %d ctx %d tok/s %.1f mean %.2f p50 %.2f ms eff %.3f overlapped %s "
          "split %s experts %s ms main %s read %s GB/s" % (
              r["batch"], r["context"], r["decode_tokens_per_s"], 1e3 * r["mean_step_s"],
              1e3 * r["p50_step_s"], r.get("bound_efficiency") or 0, r.get("overlapped_steps"),
              r.get("pipelined_steps"), None if es is None else round(1e3 * es, 2),
              main[0] if main else None,
              [round(x, 1) for x in r.get("cpu_read_gbps") or [] if x is not None]))
PY
  done
}

# chain NAME CAP [VAR=value...]: issue 6's CPU-experts Qwen3-30B-A3B 4 x 128K decode step under
# `bench.step_profile --timeline` (32 GiB, synthetic prefill, 4 warm-up steps, 8 timed and 8 profiled)
# against $P (calibrate_profile first) with the given environment, into $R/NAME.json; prints
# the step's time and its CPU chain (bench/cpu_chain.py: the CPU attention and expert kernels,
# the waits between them, the step's start and end).
chain() {
  local name=$1 cap=$2; shift 2
  run $name $cap env WRITESCOPE_STACKS_EVERY_S=150 "$@" python -m writescope.bench.step_profile \
    --model qwen3-30b-a3b --random-weights --profile $P --vram-budget 32GiB --experts cpu \
    --batch 4 --context 128k --max-num-batched-tokens 16384 --prefill synthetic --warmup 4 \
    --steps 8 --top 12 --timeline --json $R/$name.json
  grep -A2 -E "^CPU chain|^decode step" $R/$name.log | head -8; grep -E "^link|^staging plans|results from seen" $R/$name.log
}
