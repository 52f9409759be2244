"""What the decode-kernel benches (``gpu_experts``, ``gpu_gemv``) share: a step's layers replayed
from one CUDA graph (the engine's form: no launch path in the timing), their common flags and
their JSON record."""
from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from .provenance import git_commit, source_digest


def graph_replay(fn, dev):
    """``fn`` (a decode step's calls) captured as one CUDA graph after a warm-up on a side
    stream; returns the graph's ``replay``."""
    fn()  # compile
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def add_common_args(ap: argparse.ArgumentParser, models: tuple[str, ...]) -> None:
    ap.add_argument("--models", default=",".join(models))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sweep", action="store_true", help="also time other launch settings")
    ap.add_argument("--json")


def write_json(path: str, module: str, argv, dev, hbm: float, results: list) -> None:
    """The run's record: command, commit, source digest, machine, HBM copy rate, results."""
    with open(path, "w") as f:
        json.dump({"command": " ".join([f"python -m {module}"]
                                       + list(argv if argv is not None else sys.argv[1:])),
                   "commit": git_commit(), "source_digest": source_digest(),
                   "machine": {"gpu": torch.cuda.get_device_name(dev),
                               "python": platform.python_version(), "torch": torch.__version__},
                   "hbm_copy_gbps": hbm, "results": results}, f, indent=1)
