"""``python -m writescope.bench.prefix_cache [--model M] [--contexts 1024 3072] [--json FILE]``:
what prefix caching saves the next turn of a conversation.

For each context length N: a first turn (a prompt of N random tokens, ``--answer`` tokens
generated), then the next turn -- that prompt, its answer and ``--turn`` new tokens -- timed to
its first token (TTFT: prefill and the first sample), once with prefix caching off and once on,
on the same engine and weights (the cache rebuilt between the two). Each repetition uses other
tokens, so no turn finds another repetition's blocks. Prints and writes, per N, the median TTFT
both ways, the prompt tokens found in the cache, and the speedup.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from .engine_args import add_engine_args, build_engine
from .provenance import result_header, write_json


def _ttft(engine, rid: str, prompt: list[int], params) -> tuple[float, object]:
    """Seconds from submitting ``prompt`` to its first output token; the finished output."""
    t0 = time.perf_counter()
    engine.add_request(rid, prompt, params)
    first, last = None, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid:
                last = out
                if first is None and out.token_ids:
                    first = time.perf_counter() - t0
    return first, last


def measure(engine, contexts: list[int], answer: int, turn: int, reps: int) -> list[dict]:
    from ..core import SamplingParams
    vocab = engine.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    first_turn = SamplingParams(temperature=0.0, max_tokens=answer, ignore_eos=True)
    rows = []
    for n in contexts:
        row = {"context": n, "answer": answer, "turn": turn}
        for mode in ("off", "on"):
            engine.enable_prefix_caching = mode == "on"
            engine.set_kv_policy(engine.kv_policy)
            times, cached = [], []
            for r in range(reps + 1):  # the first repetition warms up
                prompt = torch.randint(3, vocab, (n,), generator=gen).tolist()
                _, out = _ttft(engine, f"{mode}-{n}-{r}-a", prompt, first_turn)
                follow = prompt + out.token_ids + \
                    torch.randint(3, vocab, (turn,), generator=gen).tolist()
                t, out2 = _ttft(engine, f"{mode}-{n}-{r}-b", follow, one)
                if r:
                    times.append(t)
                    cached.append(out2.num_cached_tokens)
            row[f"ttft_{mode}_ms"] = 1e3 * statistics.median(times)
            row[f"cached_tokens_{mode}"] = min(cached)
            row["next_prompt_tokens"] = len(follow)
        row["speedup"] = row["ttft_off_ms"] / row["ttft_on_ms"]
        rows.append(row)
        print(f"{n:>8} {row['next_prompt_tokens']:>8} {row['cached_tokens_on']:>8} "
              f"{row['ttft_off_ms']:>10.1f} {row['ttft_on_ms']:>10.1f} {row['speedup']:>7.1f}x",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m writescope.bench.prefix_cache",
                                 description=__doc__.split("\n\n")[1])
    add_engine_args(ap)
    ap.add_argument("--kv-policy", default="writescope")
    # the default model's 4,096 positions hold a 3,072-token context, its answer and next turn
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 3072])
    ap.add_argument("--answer", type=int, default=32, help="tokens the first turn generates")
    ap.add_argument("--turn", type=int, default=64, help="new tokens the next turn adds")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if min(args.contexts) < 1 or args.answer < 1 or args.turn < 1 or args.reps < 1:
        ap.error("--contexts, --answer, --turn and --reps must be positive")
    engine = build_engine(args, kv_policy=args.kv_policy, max_num_seqs=2,
                          max_model_len=max(args.contexts) + args.answer + args.turn + 8,
                          max_num_batched_tokens=args.max_num_batched_tokens)
    print(f"{engine.model_name} on {engine.device}, kv_policy {args.kv_policy}, block size "
          f"{engine.cache.bs}: the next turn's time to first token, prefix caching off / on")
    print(f"{'context':>8} {'next':>8} {'cached':>8} {'off ms':>10} {'on ms':>10} {'speedup':>8}")
    rows = measure(engine, args.contexts, args.answer, args.turn, args.reps)
    if args.json:
        write_json(args.json, {**result_header("prefix_cache", argv), "device": str(engine.device),
                               "model": engine.model_name, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
