"""Decode steps replayed as CUDA graphs, piecewise: every layer's work except attention.

A decode step launches ~100 kernels per layer; on the H200 machine its host time, not the GPU,
set the step time (2,681 launches and ~100 ms per DeepSeek-V2-Lite step at batch 4 against a
6 ms roofline bound, bench/results/2026-11-30b-h200/step_profile.json). The work between two
attention calls -- output projection, residual, norms, router, experts, the next layer's
projections and rotary -- depends only on the hidden states, so it is captured once per step
size as a CUDA graph and replayed with one launch. Attention stays eager: its plan (blocks,
regions, CPU share) changes every step. So do layers whose experts run on the CPU, and any piece
that would synchronise with the host for that step size (the grouped expert path). This is the
piecewise capture vLLM v1 uses; the code is ours.

The forward pass is a list of :class:`Piece` (``embed``, per layer ``pre``/``attn``/``post``/
``ffn``, ``norm``) over a dict of named tensors. Runs of graph-safe pieces form a
:class:`Segment`. Step sizes are bucketed (``GRAPH_SIZES``): a step of ``n`` tokens runs padded
to the next size, the eager pieces (attention, CPU experts) on its first ``n`` rows only. The
first decode step of a size runs every piece eagerly and keeps a copy of each segment's inputs;
after that step the segments are captured (a warm-up run, then the capture, in a memory pool
shared by all graphs). Later steps of that size copy eager outputs (the attention result) into
the first rows of the graph's input buffers and replay; an input that an earlier graph produced
is read in place. A capture that fails turns graphs off with one warning; the engine then runs
eagerly as before.

``WRITESCOPE_CUDA_GRAPHS=0`` turns graphs off; ``=pieces`` runs the piece list eagerly on any
device (how the CPU tests check the decomposition against the model's own forward).
"""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..attention.merge import merge

#: the step sizes that are captured: a decode step of ``n`` tokens runs in the smallest size
#: ``>= n``, its extra rows padding (rows never mix outside attention, and attention sees only
#: the real ones), so a server whose batch size changes every step captures at most these
GRAPH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
#: decode steps of at most this many tokens are graphed
MAX_GRAPH_TOKENS = GRAPH_SIZES[-1]


def bucket(n: int) -> int:
    """The captured size a decode step of ``n`` tokens runs in."""
    for b in GRAPH_SIZES:
        if b >= n:
            return b
    raise ValueError(f"no graph size holds {n} tokens (at most {MAX_GRAPH_TOKENS})")


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    out = t.new_zeros((rows,) + tuple(t.shape[1:]))
    out[:t.shape[0]] = t
    return out


def mode() -> str:
    """``"on"`` (default), ``"off"`` or ``"pieces"`` (eager pieces, no capture)."""
    v = os.environ.get("WRITESCOPE_CUDA_GRAPHS", "1").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    return "pieces" if v == "pieces" else "on"


@dataclass
class Piece:
    name: str
    fn: Callable[[dict, object], None]  # (env, attention context)
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    graphable: bool


@dataclass
class Segment:
    pieces: list[Piece]
    graph: object = None  # torch.cuda.CUDAGraph once captured
    static_in: dict[str, torch.Tensor] = field(default_factory=dict)
    static_out: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def graphable(self) -> bool:
        return self.pieces[0].graphable

    # the piece list is complete once segments() has returned; these are read every step
    @functools.cached_property
    def inputs(self) -> list[str]:
        seen, out = set(), []
        for p in self.pieces:
            out += [k for k in p.reads if k not in seen and k not in out]
            seen.update(p.writes)
        return out

    @functools.cached_property
    def outputs(self) -> list[str]:
        out = []
        for p in self.pieces:
            out += [k for k in p.writes if k not in out]
        return out

    def run_eager(self, env: dict, ctx) -> None:
        for p in self.pieces:
            p.fn(env, ctx)

    def run_rows(self, env: dict, ctx, n: int) -> None:
        """Run eagerly on the first ``n`` rows of every input (the real tokens of a padded
        step); only this segment's outputs go back into ``env``."""
        local = dict(env)
        for k in self.inputs:
            if local[k].shape[0] != n:
                local[k] = local[k][:n]
        self.run_eager(local, ctx)
        env.update({k: local[k] for k in self.outputs})


def _layer_pieces(i: int, layer, n: int, cache) -> list[Piece]:
    attn, ffn = layer.self_attn, layer.ffn

    def pre(env, ctx):
        q, rec = attn.pre(layer.input_layernorm(env["x"]), (env["cos"], env["sin"]))
        env["q"], env["rec"] = q, rec
        env["o_self"], env["l_self"] = cache.decode_self_partial(q, rec)

    def attend(env, ctx):  # the only part that depends on the step's plan
        env["o_kv"], env["l_kv"] = ctx.attend_cached(i, env["q"], env["rec"])

    def post(env, ctx):
        o, _ = merge(env["o_kv"], env["l_kv"], env["o_self"], env["l_self"])
        x = env["x"] + attn.post(o.to(env["q"].dtype))
        env["x"] = x
        env["h"] = layer.post_attention_layernorm(x)

    def mlp(env, ctx):
        env["x"] = env["x"] + ffn(env["h"])

    safe = getattr(ffn, "graph_safe", None)
    return [Piece(f"pre{i}", pre, ("x", "cos", "sin"), ("q", "rec", "o_self", "l_self"), True),
            Piece(f"attn{i}", attend, ("q", "rec"), ("o_kv", "l_kv"), False),
            Piece(f"post{i}", post, ("x", "o_kv", "l_kv", "o_self", "l_self", "q"), ("x", "h"),
                  True),
            Piece(f"ffn{i}", mlp, ("x", "h"), ("x",), True if safe is None else safe(n))]


def decode_pieces(model, n: int, cache) -> list[Piece]:
    """The model's forward pass for ``n`` new tokens, one per sequence, as pieces (equal to
    ``model.forward`` over ``cache``)."""
    m, rot = model.model, model.rotary

    def embed(env, ctx):
        env["x"] = m.embed_tokens(env["ids"])
        env["cos"], env["sin"] = rot.cos_sin(env["pos"])

    def norm(env, ctx):
        env["out"] = m.norm(env["x"])

    pieces = [Piece("embed", embed, ("ids", "pos"), ("x", "cos", "sin"), True)]
    for i, layer in enumerate(m.layers):
        pieces += _layer_pieces(i, layer, n, cache)
    pieces.append(Piece("norm", norm, ("x",), ("out",), True))
    return pieces


def segments(pieces: list[Piece]) -> list[Segment]:
    out: list[Segment] = []
    for p in pieces:
        if out and out[-1].graphable == p.graphable:
            out[-1].pieces.append(p)
        else:
            out.append(Segment([p]))
    return out


def supported(model) -> bool:
    return all(hasattr(l.self_attn, "pre") and hasattr(l.self_attn, "post")
               for l in model.model.layers)


class DecodeGraphs:
    """Per step size: the segments, captured after the first eager step of that size."""

    def __init__(self, model, device: torch.device, cache):
        self.model = model
        self.cache = cache
        self.device = torch.device(device)
        self.mode = mode()
        self.plans: dict[int, list[Segment]] = {}
        self._pending: tuple[int, list[Segment]] | None = None
        self._pool = None
        self.disabled_reason: str | None = None
        self.counters = {"graphs.captured_sizes": 0, "graphs.replayed_steps": 0,
                         "graphs.segments": 0, "graphs.capture_s": 0.0}

    def wants(self, n: int) -> bool:
        if self.mode == "off" or self.disabled_reason or not 1 <= n <= MAX_GRAPH_TOKENS:
            return False
        return self.mode == "pieces" or self.device.type == "cuda"

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        """The forward pass of a decode step of ``n = len(input_ids)`` tokens: final-normed
        hidden states as ``model.forward`` returns them, in the first ``n`` of ``bucket(n)``
        rows."""
        n = input_ids.shape[0]
        size = bucket(n)
        env = {"ids": input_ids, "pos": positions}
        segs = self.plans.get(size)
        if segs is None:  # eagerly, padded to the size (and kept as the capture's inputs)
            segs = segments(decode_pieces(self.model, size, self.cache))
            for seg in segs:
                if not seg.graphable:
                    seg.run_rows(env, ctx, n)
                    continue
                for k in seg.inputs:
                    env[k] = _padded(env[k], size)
                if self.mode == "on":
                    seg.static_in = {k: env[k].clone() for k in seg.inputs}
                seg.run_eager(env, ctx)
            if self.mode == "on":
                self._pending = (size, segs)
            return env["out"]
        for seg in segs:
            if seg.graph is None:
                seg.run_rows(env, ctx, n)
                continue
            for k, buf in seg.static_in.items():
                v = env[k]
                if v is not buf:  # rows past n keep what they held: padding
                    buf[:v.shape[0]].copy_(v)
            seg.graph.replay()
            env.update(seg.static_out)
        self.counters["graphs.replayed_steps"] += 1
        return env["out"]

    def drop_pending(self) -> None:
        """The step failed: do not capture from its inputs."""
        self._pending = None

    def stats(self) -> dict:
        return dict(self.counters, **{"graphs.mode": self.mode if not self.disabled_reason
                                      else f"off ({self.disabled_reason})"})

    @torch.no_grad()
    def capture_pending(self) -> None:
        """Capture the segments of the step size that just ran eagerly (call between steps)."""
        if self._pending is None:
            return
        import time
        n, segs = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            self._capture(segs)
        except Exception as e:  # noqa: BLE001 - any failure: eager from now on
            self.disabled_reason = f"{type(e).__name__}: {e}"
            self.plans.clear()
            warnings.warn(f"CUDA graph capture failed ({self.disabled_reason}); decode steps run "
                          "eagerly (WRITESCOPE_CUDA_GRAPHS=0 silences this)", RuntimeWarning,
                          stacklevel=2)
            return
        self.plans[n] = segs
        self.counters["graphs.captured_sizes"] = len(self.plans)
        self.counters["graphs.segments"] += sum(s.graph is not None for s in segs)
        self.counters["graphs.capture_s"] += time.perf_counter() - t0

    def _capture(self, segs: list[Segment]) -> None:
        torch.cuda.synchronize(self.device)
        writer: dict[str, torch.Tensor | None] = {}  # key -> static output of its last graph
        side = torch.cuda.Stream(self.device)
        for seg in segs:
            if not seg.graphable:
                for k in seg.outputs:
                    writer[k] = None
                continue
            for k in seg.inputs:  # produced by an earlier graph: read it in place
                if writer.get(k) is not None:
                    seg.static_in[k] = writer[k]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up (allocator, cuBLAS and Triton state)
                seg.run_eager(dict(seg.static_in), None)
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            env = dict(seg.static_in)
            with torch.cuda.graph(g, pool=self._pool, capture_error_mode="thread_local"):
                seg.run_eager(env, None)
            if self._pool is None:
                self._pool = g.pool()
            seg.graph = g
            seg.static_out = {k: env[k] for k in seg.outputs}
            for k in seg.outputs:
                writer[k] = seg.static_out[k]
        torch.cuda.synchronize(self.device)
