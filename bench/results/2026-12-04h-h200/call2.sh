# 2026-12-04h call 2: the link's experts copied by DMA (read mode copy, the default) against the
# zero-copy reads (mapped) and the CPU alone: GPU tests, the layer-call microbenchmark, batch-1
# engine rows of DeepSeek-V2-Lite and Qwen3-30B-A3B with the link on and off alternating.
source bench/results/run-helper.sh
call_begin 520
P=bench/profiles/h200.json
run link-tests 150 env WRITESCOPE_PROFILE=$PWD/$P python -m pytest -m gpu -q -p no:cacheprovider \
  --tb=short -rf -o faulthandler_timeout=60 tests/test_expert_link.py
run link-bench 150 python -m writescope.bench.expert_link --profile $P --models deepseek-v2-lite \
  qwen3-30b-a3b --tokens 1 4 --shares 0 profile 0.25 0.5 1 --reads copy mapped \
  --json $R/link-bench.json
run ds-1x8k 150 python -m writescope bench --model deepseek-v2-lite --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 4k \
  --decode-steps 24 --prefill synthetic --no-progress --batch 1 --context-lengths 8k --rounds 2 \
  --policies writescope,writescope@expert_link=0 --out $R/ds-1x8k
run qw-1x1k 200 python -m writescope bench --model qwen3-30b-a3b --random-weights --profile $P \
  --vram-budget 32GiB --experts cpu --max-num-batched-tokens 16384 --warmup-length 1k \
  --decode-steps 24 --prefill synthetic --no-progress --batch 1 --context-lengths 1k --rounds 2 \
  --policies writescope,writescope@expert_link=0 --out $R/qw-1x1k
call_end
