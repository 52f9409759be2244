"""``python -m writescope.bench.naps [--rounds N] [--json FILE]``: what the waiting threads' timer
slack costs (``WRITESCOPE_TIMER_SLACK_NS``, :func:`writescope.attention.hostflag.precise_naps`).

The threads that wait for the device poll a pinned word and nap 20 us at a time between polls.
Linux lets each sleep end late by its thread's timer slack, 50 us unless the thread sets another.
For each setting (the engine's default, 1000 ns, against Linux's ``default``), in rounds that
alternate them:

* the nap itself: the mean length of ``time.sleep(20e-6)`` in a fresh thread with that slack;
* with CUDA, one layer's CPU attention round trip as a decode step pays it
  (:func:`writescope.planner.calibrate.cpu_attn_roundtrip_s`: the native queue's thread -- each
  hybrid step object starts its own, which reads the setting -- waits for the layer's queries,
  attends one block per sequence, raises the word the device waits on; the next layer's queries
  depend on the result), for DeepSeek-V2-Lite's MLA and Qwen3-30B-A3B's GQA shapes.

Prints one line per round and the medians; ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from unittest import mock

import torch

from ..attention.hostflag import precise_naps

SETTINGS = ("1000", "default")


def nap_us(setting: str, naps: int = 2000) -> float:
    """Mean microseconds of a 20 us ``time.sleep`` in a new thread with ``setting``'s slack."""
    out: list[float] = []

    def body():
        precise_naps()
        t0 = time.perf_counter()
        for _ in range(naps):
            time.sleep(20e-6)
        out.append((time.perf_counter() - t0) / naps * 1e6)
    with _slack(setting):
        t = threading.Thread(target=body)
        t.start()
        t.join()
    return out[0]


def _slack(setting: str):
    """``WRITESCOPE_TIMER_SLACK_NS`` set to ``setting`` inside the block."""
    return mock.patch.dict(os.environ, {"WRITESCOPE_TIMER_SLACK_NS": setting})


def roundtrip_us(model: str, setting: str, reps: int) -> float:
    """One layer's CPU attention round trip in the decode chain, microseconds (CUDA)."""
    from ..models.config import ModelConfig
    from ..planner.calibrate import cpu_attn_roundtrip_s
    with _slack(setting):
        return cpu_attn_roundtrip_s(ModelConfig.from_hf(model), "cuda", reps) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30, help="round trips' steps per measurement")
    ap.add_argument("--models", default="deepseek-v2-lite,qwen3-30b-a3b")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    models = [m for m in args.models.split(",") if m] if cuda else []
    rows: dict[str, dict[str, list[float]]] = {s: {"nap_us": []} for s in SETTINGS}
    for s in SETTINGS:
        for m in models:
            rows[s][f"roundtrip_us.{m}"] = []
    for r in range(args.rounds):
        order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
        for s in order:
            rows[s]["nap_us"].append(nap_us(s))
            for m in models:
                rows[s][f"roundtrip_us.{m}"].append(roundtrip_us(m, s, args.reps))
            print(f"round {r} slack {s:>7}: " + ", ".join(
                f"{k} {v[-1]:.1f}" for k, v in rows[s].items()), flush=True)
    med = {s: {k: statistics.median(v) for k, v in rows[s].items()} for s in SETTINGS}
    for s in SETTINGS:
        print(f"median, slack {s:>7}: " + ", ".join(f"{k} {v:.1f}" for k, v in med[s].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rounds": rows, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
