"""``python -m writescope.bench.structured [--model PATH] [--device cuda] [--batch 1 8 32]
[--json FILE]``: what structured outputs cost a decode step.

For each batch size it generates greedily from the same prompts three times -- free, under a
JSON schema (an object of bounded fields, so that every row runs to ``--max-tokens`` or its
closing brace), under a regex -- and reports decode tokens/s, the host time spent on the
grammars' masks per masked row (``Grammars.mask_s`` / ``rows_masked``: computing the bitmasks
with llguidance, unpacking and applying them) and that time's share of the run. The model
needs a tokenizer (default: the embedded default model, whose vocabulary is 1,024 tokens; the
mask's cost grows with the vocabulary, so a real checkpoint's figure is the one to quote).
"""
from __future__ import annotations

import argparse
import time

from ..core import SamplingParams, StructuredOutputsParams
from .provenance import result_header, write_json

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "tags", "note"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                  "maxItems": 4},
                         "note": {"type": "string", "maxLength": 200}}}
CONSTRAINTS = {"free": None, "json_schema": StructuredOutputsParams(json=SCHEMA),
               "regex": StructuredOutputsParams(regex=r"([a-z]{2,8} ){1,100}")}


def measure(llm, batches: list[int], max_tokens: int) -> list[dict]:
    rows = []
    words = ["the", "sea", "report", "cache", "a", "story", "of", "long", "time"]
    for b in batches:
        prompts = [" ".join(words[(i + j) % len(words)] for j in range(12)) for i in range(b)]
        # the batch size's first run (its shapes' first steps) is not the free row's
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                             ignore_eos=True), use_tqdm=False)
        for name, so in CONSTRAINTS.items():
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                    structured_outputs=so)
            llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4,
                                                     structured_outputs=so),
                         use_tqdm=False)  # compile, warm
            g = llm.engine.grammars
            s0, r0 = g.mask_s, g.rows_masked
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
            toks = sum(len(o.token_ids) for o in outs)
            masked = g.rows_masked - r0
            rows.append({"batch": b, "constraint": name, "tokens": toks, "seconds": dt,
                         "tokens_per_s": toks / dt, "rows_masked": masked,
                         "mask_us_per_row": 1e6 * (g.mask_s - s0) / masked if masked else 0.0,
                         "mask_share": (g.mask_s - s0) / dt})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a checkpoint folder with a tokenizer (default: embedded)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    from ..llm import LLM
    llm = LLM(args.model, dtype=args.dtype, device=args.device,
              max_num_seqs=max(args.batch), max_model_len=1024,
              enable_prefix_caching=False)  # each row prefills its prompts, as before
    vocab = llm.engine.config.vocab_size
    rows = measure(llm, args.batch, args.max_tokens)
    print(f"{llm.engine.model_name} on {llm.engine.device}, vocabulary {vocab}, greedy, "
          f"{args.max_tokens} new tokens a request")
    print(f"{'batch':>5} {'constraint':>12} {'tokens':>7} {'tok/s':>9} {'mask us/row':>12} "
          f"{'mask share':>11}")
    for r in rows:
        print(f"{r['batch']:5d} {r['constraint']:>12} {r['tokens']:7d} {r['tokens_per_s']:9.1f} "
              f"{r['mask_us_per_row']:12.1f} {100 * r['mask_share']:10.1f}%")
    if args.json:
        write_json(args.json, {**result_header("structured", argv), "device": str(llm.engine.device),
                               "model": llm.engine.model_name, "vocab": vocab, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
