#!/bin/bash
# Call 4 (the session's last device time): GPU tests at the final tree, the new AMX kernel on the
# GQA shapes, then the first full-size Qwen3-30B-A3B / Mixtral-8x7B rows of issue 6 from
# bench/results/grid-commands.sh (its time estimates and memory plan: grid-plan.md), with caps
# cut to fit one call; the Mixtral experts-on-GPU run is left out.
export PYTHONUNBUFFERED=1
T0=$(date +%s); DEADLINE=$((T0 + 555))
R=$OUT/r; mkdir -p $R
pip install -e . --no-deps --no-build-isolation -q > $R/pip.log 2>&1
python -m writescope.bench.provenance > $R/provenance.txt 2>&1
(free -g; grep -E "MemTotal|MemAvailable|Hugepagesize" /proc/meminfo; nproc) > $R/host.txt 2>&1

run() {  # run NAME CAP_S COMMAND...: timeout = min(CAP_S, time left to the deadline)
  local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - $(date +%s)))
  local t=$(( cap < left ? cap : left ))
  if [ $t -lt 40 ]; then echo "[$name] skipped: ${left} s left" | tee -a $R/skipped.txt; return; fi
  local s=$(date +%s)
  ( while sleep 10; do echo "$(( $(date +%s) - s )) s $(grep MemAvailable /proc/meminfo)"; done ) \
    > $R/$name.mem.log 2>&1 &
  local mon=$!
  timeout -k 5 $t "$@" > $R/$name.log 2>&1
  local rc=$?
  kill $mon 2>/dev/null
  echo "[$name] rc=$rc after $(( $(date +%s) - s )) s (timeout $t s)"
  grep "\[bench\]" $R/$name.log | head -3
  tail -2 $R/$name.log
}

run gpu-tests 110 env WRITESCOPE_PROFILE=$PWD/bench/profiles/h200.json python -m pytest -m gpu -q \
  -p no:cacheprovider --tb=short -rf -o faulthandler_timeout=60
run cpu-attention-gqa 45 python -m writescope.bench.cpu_attention --shapes gqa-32/4/128 --reps 3 \
  --torch-reps 0 --no-variants --json $R/cpu_attention_gqa.json
B="python -m writescope bench --random-weights --profile bench/profiles/h200.json --batch 4 --max-num-batched-tokens 16384 --no-progress"
run qwen3-cpu-experts 170 $B --model qwen3-30b-a3b --vram-budget 32GiB --experts cpu \
  --num-gpu-blocks 128 --context-lengths 8k,32k --decode-steps 16 --policies writescope,transfer,cpu \
  --out $R/qwen3-cpu-experts
run mixtral-cpu-experts 180 $B --model mixtral-8x7b --vram-budget 32GiB --experts cpu \
  --num-gpu-blocks 640 --pinned-budget 11.5GiB --host-budget 11.5GiB --context-lengths 32k \
  --decode-steps 12 --policies writescope,transfer,cpu --out $R/mixtral-cpu-experts
run qwen3-gpu-experts 70 $B --model qwen3-30b-a3b --vram-budget 80GiB --experts gpu \
  --num-gpu-blocks 1365 --context-lengths 32k --decode-steps 16 --policies writescope,transfer \
  --out $R/qwen3-gpu-experts
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf r.tgz r && rm -rf r
