"""The engine options the single-engine benches share (``bench.prefix_cache``,
``bench.shared_prefix``): which model, its weights and dtype, the device and VRAM budget, where
the routed experts run; and the engine built from them."""
from __future__ import annotations

import argparse

from .grid import parse_overrides


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="checkpoint folder or reference name (default: "
                    "the embedded default model)")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--vram-budget", default=None)
    ap.add_argument("--experts", default="auto", choices=("auto", "gpu", "cpu"))


def build_engine(args: argparse.Namespace, **engine_kwargs):
    """An :class:`LLMEngine` from :func:`add_engine_args`' options and ``engine_kwargs`` (the
    bench's own: policy, batch, lengths)."""
    from ..engine.engine import LLMEngine
    overrides = parse_overrides(args.config_override)
    return LLMEngine(args.model, dtype=args.dtype, device=args.device,
                     random_weights=args.random_weights, config_overrides=overrides or None,
                     vram_budget=args.vram_budget, experts=args.experts, **engine_kwargs)
