#!/bin/bash
# Sixty-fourth session's block-completing resident steps, measured where they matter: prompts
# whose lengths are spread over a KV block (`--length-spread 64`), so that the sequences complete
# their blocks on different steps, as a server's do -- at batch 16 about a quarter of the steps
# complete one. Qwen3-30B-A3B FP8 kv auto under the defaults (`bench_row`), batch 4 and 16 x 8K,
# against WRITESCOPE_G_BLOCKS_ON_DEVICE=0 (such steps eager and synchronous, as before),
# alternating on one host. Carry .whl. CALL_S=420 (timeout 480).
source bench/results/run-helper.sh
call_begin ${CALL_S:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
calibrate_profile 45
Q='quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}'
for r in on-1 off-1 off-2 on-2; do
  export WRITESCOPE_G_BLOCKS_ON_DEVICE=$([ ${r%-*} = on ] && echo 1 || echo 0)
  bench_row s-$r 80 qwen3-30b-a3b 8k --config-override "$Q" --batch 4,16 --length-spread 64
done
unset WRITESCOPE_G_BLOCKS_ON_DEVICE
row_summary s-on-1 s-off-1 s-off-2 s-on-2
call_end
