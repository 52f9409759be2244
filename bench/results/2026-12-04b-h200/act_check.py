"""Mixtral-8x7B's G pool under issue 6's 2 x 32K command (98 GiB, 16,384 batched tokens): the
blocks the engine's measured activation peak leaves, as the bench builds it; with --cublas-first
a small matmul runs on the device before the build (cuBLAS's workspaces then exist before the
measurement). Prints the G/T/C/W blocks and the CUDA memory the build left allocated."""
import argparse
import math

import torch

from writescope.engine.engine import LLMEngine

ap = argparse.ArgumentParser()
ap.add_argument("--cublas-first", action="store_true")
args = ap.parse_args()
if args.cublas_first:
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
max_len = 32768 + 12 + math.ceil(2 * 32768 / 16384) + 2 + 8
eng = LLMEngine("mixtral-8x7b", random_weights=True, max_num_seqs=2, max_model_len=max_len,
                max_num_batched_tokens=16384, vram_budget="98GiB", kv_policy="transfer",
                experts="gpu", profile="bench/profiles/h200.json")
print("cublas_first", args.cublas_first, "blocks", {str(r): n for r, n in eng.cache.layout.num_blocks.items()},
      "allocated GiB", round(torch.cuda.memory_allocated() / 2**30, 3),
      "build", {k: round(v, 1) for k, v in eng.build_times.items()}, flush=True)
