"""``python -m writescope.bench.beam_search [--model M] [--contexts 1024 3072] [--cprofile N] [--json FILE]``:
what a beam search step costs against a decode step of as many sequences.

For each context length N: a prompt of N random tokens (its blocks cached by a first request),
then a beam search of ``--beam-width`` beams for ``--steps`` steps (each step re-adds every live
beam as a one-token request: engine/beam.py), and a sampled generation of ``--beam-width``
completions of as many tokens (``n``: the same batch of sequences decoding). Prints and writes,
per N, the median milliseconds of a beam step and of a decode step, their ratio, and the host's
share of a beam step spent adding its requests (checking and naming their prompts): what
``engine/beam.py``'s :class:`BeamPrompt` keeps from growing with the prompt. A beam step
computes one token a beam where the parent's partial last block was kept (``kvcache/tails.py``),
so its ratio to a decode step is what re-adding the beams costs. ``--cprofile N`` then runs a
search of N steps at the longest context with its steps after the first under cProfile, and
lists the Python functions by host time a step (``step_profile.python_profile``): where the
rest of a beam step goes on the host.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from .engine_args import add_engine_args, build_engine
from .provenance import result_header, write_json

_ids = itertools.count()


def beam_steps(engine, prompt: list[int], width: int, steps: int):
    """One search, a step at a time: yields each step's seconds and its seconds spent in
    ``add_request`` (the search runs ``steps`` steps: its beams ignore EOS)."""
    from ..engine.beam import BeamSearchParams
    params = BeamSearchParams(beam_width=width, max_tokens=steps, ignore_eos=True)
    search = engine.beam_search(prompt, params)
    one = params.step_params()
    while not search.done:
        t0 = time.perf_counter()
        rids = [f"beam-{next(_ids)}" for _ in search.live]
        for rid, p in zip(rids, search.prompts()):
            engine.add_request(rid, p, one)
        t1 = time.perf_counter()
        outs = {}
        while engine.has_unfinished_requests():
            outs.update((o.request_id, o) for o in engine.step() if o.finished)
        search.advance([outs[r].outputs[0].logprobs[0] for r in rids])
        yield time.perf_counter() - t0, t1 - t0


def _beam_steps(engine, prompt: list[int], width: int, steps: int) -> tuple[list[float],
                                                                              list[float]]:
    """One search's step times and, per step, the time spent in ``add_request``."""
    times = list(beam_steps(engine, prompt, width, steps))
    return [t for t, _ in times], [a for _, a in times]


def profile_beam_steps(engine, context: int, width: int, steps: int, top: int) -> dict:
    """A search of ``steps`` steps over a random prompt of ``context`` tokens (cached by a first
    request, as :func:`measure`'s), its steps after the first under cProfile
    (``step_profile.python_profile``): where a beam step's host time goes."""
    from ..core import SamplingParams
    from .step_profile import python_profile
    prompt = torch.randint(3, engine.config.vocab_size, (context,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    engine.add_request(f"warm-{next(_ids)}", prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    search = beam_steps(engine, prompt, width, steps)
    next(search)  # the first step prefills the prompt's last block once
    return {"context": context, **python_profile(lambda: next(search), steps - 1, top)}


def _decode_steps(engine, prompt: list[int], width: int, steps: int) -> float:
    """Seconds a decode step of ``width`` sequences takes (``n`` sampled completions), the
    prefill and first token left out."""
    from ..core import SamplingParams
    rid = f"decode-{next(_ids)}"
    engine.add_request(rid, prompt, SamplingParams(n=width, temperature=1.0, seed=0,
                                                   max_tokens=steps + 1, ignore_eos=True))
    times, last = [], None
    while engine.has_unfinished_requests():
        engine.step()
        now = time.perf_counter()
        if last is not None:
            times.append(now - last)
        last = now
    return statistics.median(times[1:] or times)


def measure(engine, contexts: list[int], width: int, steps: int, reps: int) -> list[dict]:
    from ..core import SamplingParams
    vocab = engine.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in contexts:
        beam, add, dec = [], [], []
        for r in range(reps + 1):  # the first repetition warms up
            prompt = torch.randint(3, vocab, (n,), generator=gen).tolist()
            engine.add_request(f"warm-{next(_ids)}", prompt,
                               SamplingParams(max_tokens=1, ignore_eos=True))
            while engine.has_unfinished_requests():  # the prompt's full blocks cached
                engine.step()
            s, a = _beam_steps(engine, prompt, width, steps)
            d = _decode_steps(engine, prompt, width, steps)
            if r:
                beam += s[1:]  # the first step prefills the prompt's last block once
                add += a[1:]
                dec.append(d)
        row = {"context": n, "beam_width": width, "steps": steps,
               "beam_step_ms": 1e3 * statistics.median(beam),
               "decode_step_ms": 1e3 * statistics.median(dec),
               "add_requests_ms": 1e3 * statistics.median(add)}
        row["beam_over_decode"] = row["beam_step_ms"] / row["decode_step_ms"]
        rows.append(row)
        print(f"{n:>8} {row['beam_step_ms']:>10.2f} {row['decode_step_ms']:>10.2f} "
              f"{row['beam_over_decode']:>7.2f}x {row['add_requests_ms']:>10.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.beam_search",
                                 description=__doc__.split("\n\n")[1])
    add_engine_args(ap)
    ap.add_argument("--kv-policy", default="writescope")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 3072])
    ap.add_argument("--beam-width", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="steps a search runs")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="then a search of N steps at the longest context, its steps after the "
                         "first under cProfile: the Python functions by host time")
    ap.add_argument("--top", type=int, default=25, help="functions --cprofile lists")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if min(args.contexts) < 1 or args.steps < 2 or args.reps < 1 or args.beam_width < 1:
        ap.error("--contexts, --beam-width and --reps must be positive and --steps at least 2")
    if args.cprofile == 1 or args.cprofile < 0 or args.top < 1:
        ap.error("--cprofile takes 0 (off) or at least 2 steps, --top at least 1")
    engine = build_engine(args, kv_policy=args.kv_policy,
                          max_num_seqs=max(2 * args.beam_width, 8),
                          max_model_len=max(args.contexts) + max(args.steps, args.cprofile) + 8,
                          max_num_batched_tokens=args.max_num_batched_tokens)
    if not engine.enable_prefix_caching:
        ap.error("beam search steps need prefix caching (each step re-reads the beams' blocks)")
    print(f"{engine.model_name} on {engine.device}, kv_policy {args.kv_policy}, "
          f"{args.beam_width} beams: a beam step against a decode step of as many sequences")
    print(f"{'context':>8} {'beam ms':>10} {'decode ms':>10} {'ratio':>8} {'add ms':>10}")
    rows = measure(engine, args.contexts, args.beam_width, args.steps, args.reps)
    prof = (profile_beam_steps(engine, max(args.contexts), args.beam_width, args.cprofile,
                               args.top) if args.cprofile else None)
    if args.json:
        write_json(args.json, {**result_header("beam_search", argv),
                               "device": str(engine.device), "model": engine.model_name,
                               "rows": rows, **({"cprofile": prof} if prof else {})})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
