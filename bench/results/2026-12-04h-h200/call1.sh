# 2026-12-04h call 1: the link's share of the CPU experts (layers/expert_link.py): its GPU tests,
# the layer-call microbenchmark, and batch-1 engine rows with the link on and off alternating.
source bench/results/run-helper.sh
call_begin 555
P=bench/profiles/h200.json
run link-tests 150 env WRITESCOPE_PROFILE=$PWD/$P python -m pytest -m gpu -q -p no:cacheprovider \
  --tb=short -rf -o faulthandler_timeout=60 tests/test_expert_link.py tests/test_cpu_experts.py
run link-bench 170 python -m writescope.bench.expert_link --profile $P --models deepseek-v2-lite \
  qwen3-30b-a3b --tokens 1 4 --shares 0 profile 0.25 0.5 1 --json $R/link-bench.json
run ds-1x8k 200 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 24 --prefill synthetic --no-progress --batch 1 --context-lengths 8k --rounds 2 \
  --policies writescope,writescope@expert_link=0 --out $R/ds-1x8k
call_end
