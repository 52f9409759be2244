"""``python -m writescope.bench.sampler [--device cuda] [--batch 1 8 32 128] [--json FILE]``:
what sampling costs a decode step.

For each batch size and setting (temperature only; top-p 0.9; top-k 50 with top-p 0.9) over the
largest reference vocabulary (Qwen3's 151,936 tokens), it times the sampler's two ways of
drawing sampled rows, both all rows at once on the device (``Sampler.draw``): unseeded rows by
the exponential race on the device's generator, and seeded rows (``Sampler.sample`` with a seed
per row: one number from each row's own host generator, the pick by inverse CDF on the device;
until the forty-ninth session one row at a time, its probabilities copied to the host and one
``multinomial`` drawn there: 5 ms a row on the H200). Median of ``--reps`` calls, the device
synchronised after each.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..core import SamplingParams
from ..layers.sampler import Sampler
from .provenance import result_header, write_json

VOCAB = 151_936
SETTINGS = {"temperature": dict(temperature=0.8), "top_p": dict(temperature=0.8, top_p=0.9),
            "top_k+top_p": dict(temperature=0.8, top_k=50, top_p=0.9)}


def _time(fn, device: torch.device, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(device: torch.device, batches: list[int], reps: int, vocab: int = VOCAB) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for b in batches:
        logits = (torch.randn(b, vocab, generator=gen) * 3).to(device)
        for name, kw in SETTINGS.items():
            params = [SamplingParams(**kw)] * b
            seeded = [SamplingParams(seed=i, **kw) for i in range(b)]
            s = Sampler()

            def batched():
                return Sampler.draw(logits, params, list(range(b))).tolist()

            def seeded_rows():
                return s.sample(logits, seeded, list(range(b)))[0]

            rows.append({"batch": b, "setting": name,
                         "batched_ms": 1e3 * _time(batched, device, reps),
                         "seeded_ms": 1e3 * _time(seeded_rows, device, reps)})
            r = rows[-1]
            print(f"batch {b:4d} {name:12s} batched {r['batched_ms']:8.2f} ms   "
                  f"seeded {r['seeded_ms']:8.2f} ms   "
                  f"{r['seeded_ms'] / r['batched_ms']:6.1f}x", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = measure(torch.device(args.device), args.batch, args.reps, args.vocab)
    if args.json:
        write_json(args.json, {**result_header("sampler", argv), "device": args.device,
                               "vocab": args.vocab, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
