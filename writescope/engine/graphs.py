"""Decode steps replayed as CUDA graphs, piecewise: every layer's work except attention.

A decode step launches ~100 kernels per layer; on the H200 machine its host time, not the GPU,
set the step time (2,681 launches and ~100 ms per DeepSeek-V2-Lite step at batch 4 against a
6 ms roofline bound, bench/results/2026-11-30b-h200/step_profile.json). The work between two
attention calls -- output projection, residual, norms, router, experts, the next layer's
projections and rotary -- depends only on the hidden states, so it is captured once per step
size as a CUDA graph and replayed with one launch. Attention stays eager: its plan (blocks,
regions, CPU share) changes every step (unless all of the step's KV is resident,
``attention/resident.py``). So does any piece that would synchronise with the host for that
step size (the grouped expert path), and calls of experts on the CPU -- unless they are
captured by halves (``layers/cpu_experts_graph.py``; by default in resident steps only,
``WRITESCOPE_CPU_EXPERTS_GRAPHED``): the graph holds the copies, the ready word, the device's
wait and the result's copy, and each replay first queues the segment's native kernel calls
(``Segment.host_calls``). This is the piecewise capture vLLM v1 uses; the code is ours.

The forward pass is a list of :class:`Piece` (``embed``, per layer ``pre``/``attn``/``post``/
``ffn``, ``norm``) over a dict of named tensors. Runs of graph-safe pieces form a
:class:`Segment`. Step sizes are bucketed (``GRAPH_SIZES``): a step of ``n`` tokens runs padded
to the next size, the eager pieces (attention, CPU experts) on its first ``n`` rows only. The
first decode step of a size runs every piece eagerly and keeps a copy of each segment's inputs;
after that step the segments are captured (a warm-up run, then the capture, in a memory pool
shared by all graphs; a new one once every graph was dropped). Later steps of that size copy
eager outputs (the attention result) into the first rows of the graph's input buffers and
replay; an input that an earlier graph produced is read in place. A capture that fails turns
graphs off with one warning; the engine then runs eagerly as before.

``WRITESCOPE_CUDA_GRAPHS=0`` turns graphs off; ``=pieces`` runs the piece list eagerly on any
device (how the CPU tests check the decomposition against the model's own forward).
"""
from __future__ import annotations

import collections
import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..attention.selfmerge import decode_self_merge, fused_enabled
from ..layers import cpu_experts_graph

#: the step sizes that are captured: a decode step of ``n`` tokens runs in the smallest size
#: ``>= n``, its extra rows padding (rows never mix outside attention, and attention sees only
#: the real ones), so a server whose batch size changes every step captures at most these
GRAPH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
#: decode steps of at most this many tokens are graphed
MAX_GRAPH_TOKENS = GRAPH_SIZES[-1]


def _warmup_stream(device: torch.device) -> "torch.cuda.Stream":
    """The side stream the captures' warm-up runs on: one per device for the process. cuBLAS
    keeps a workspace per stream it has run on (32 MiB on Hopper) until the process ends, so a
    new stream per capture left 64-96 MiB of device memory behind each engine (sixty-third
    session, ``tests/test_engine_lifetime.py`` on an H100)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _stream_of(index)


@functools.lru_cache(maxsize=None)
def _stream_of(index: int) -> "torch.cuda.Stream":
    return torch.cuda.Stream(torch.device("cuda", index))


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
    group: int = 0  # the sub-batch of a pipelined step it works on
    #: it waits for the CPU (an attention or expert call's second half): in a pipelined step the
    #: other sub-batch's work is enqueued before it (:func:`interleave`)
    waits: bool = False
    #: a CPU-expert launch piece's calls, taken by its finish piece (first in, first out: a
    #: capture's warm-up and the capture itself each launch once before either finishes)
    pending: collections.deque | None = None


@dataclass
class Segment:
    pieces: list[Piece]
    graph: object = None  # torch.cuda.CUDAGraph once captured
    static_in: dict[str, torch.Tensor] = field(default_factory=dict)
    static_out: dict[str, torch.Tensor] = field(default_factory=dict)
    #: CPU expert calls the graph holds the device's half of (``cpu_experts_graph``): their
    #: host half is queued before each replay
    host_calls: list = field(default_factory=list)

    @property
    def graphable(self) -> bool:
        return self.pieces[0].graphable

    @property
    def group(self) -> int:
        return self.pieces[0].group

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


def _layer_pieces(i: int, layer, n: int, cache, group: int | None = None,
                  resident: bool = False, split_experts: bool = False) -> list[Piece]:
    """Layer ``i``'s pieces. ``group`` None: the whole step. Else one sub-batch of a pipelined
    step (keys prefixed ``"{group}:"``). ``resident``: the step's cached KV is all on the GPU and
    loaded into fixed buffers (``cache.attend_resident``, per sub-batch in a pipelined step):
    the attention piece is graph-safe too, and (unless ``WRITESCOPE_FUSED_SELF_MERGE=0``) it
    merges the new tokens over themselves in its own launch, handing ``post`` the output.
    Otherwise a sub-batch's attention is two pieces, ``launch`` (GPU side enqueued, CPU side
    handed to its worker) and ``finish`` (the merge), so that the other sub-batch's work can be
    enqueued between them. ``split_experts``: likewise a CPU-expert layer's MoE block is two
    pieces, ``ffn`` (router, the CPU's call queued, shared experts: ``MoE.launch``) and
    ``moe`` (the device waits for the CPU and adds: ``MoE.finish``)."""
    attn, ffn = layer.self_attn, layer.ffn
    g = 0 if group is None else group
    pre_ = "" if group is None else f"{group}:"
    x, cos, sin, q, rec = (pre_ + k for k in ("x", "cos", "sin", "q", "rec"))
    o_kv, l_kv, h, dx, o_ = (pre_ + k for k in ("o_kv", "l_kv", "h", "dx", "o"))
    first = i == 0  # no MLP output to add before this layer
    merged = resident and fused_enabled()

    def pre(env, ctx):
        # the previous layer's MLP output is added as this layer's norm runs (one kernel)
        env[x], hn = layer.input_layernorm.add_forward(env[x], None if first else env[dx])
        env[q], env[rec] = attn.pre(hn, (env[cos], env[sin]))

    def attend(env, ctx):  # the only part that depends on the step's plan
        env[o_kv], env[l_kv] = ctx.attend_cached(i, env[q], env[rec])

    def attend_resident(env, ctx):  # the plan is in fixed buffers (no ctx: also in a capture)
        env[o_kv], env[l_kv] = cache.attend_resident(i, env[q], env[rec], group)

    def attend_merged(env, ctx):  # the same, the self merge in the reduce's launch
        env[o_] = cache.attend_resident_merged(i, env[q], env[rec], group)

    def launch(env, ctx):
        ctx.attend_launch(i, env[q], env[rec], g)

    def finish(env, ctx):
        env[o_kv], env[l_kv] = ctx.attend_finish(i, g)

    def post(env, ctx):
        # the cached partial merged with each token over itself, in q's dtype (one kernel on CUDA)
        o = decode_self_merge(env[o_kv], env[l_kv], env[q], env[rec], cache.spec, cache.scale)
        env[x], env[h] = layer.post_attention_layernorm.add_forward(env[x], attn.post(o))

    def post_merged(env, ctx):
        env[x], env[h] = layer.post_attention_layernorm.add_forward(env[x], attn.post(env[o_]))

    def mlp(env, ctx):
        env[dx] = ffn(env[h])  # added by the next layer's pre (or the final norm)

    calls: collections.deque = collections.deque()

    def mlp_launch(env, ctx):
        calls.append(ffn.launch(env[h]))

    def mlp_finish(env, ctx):
        env[dx] = ffn.finish(calls.popleft())

    safe = getattr(ffn, "graph_safe", None)
    ffn_safe = True if safe is None else safe(n, resident)
    out = [Piece(f"{pre_}pre{i}", pre, (x, cos, sin) if first else (x, dx, cos, sin),
                 (x, q, rec), True, g)]
    post_piece = Piece(f"{pre_}post{i}", post, (x, o_kv, l_kv, q, rec), (x, h), True, g)
    if merged:
        out.append(Piece(f"{pre_}attn{i}", attend_merged, (q, rec), (o_,), True, g))
        post_piece = Piece(f"{pre_}post{i}", post_merged, (x, o_), (x, h), True, g)
    elif resident:
        out.append(Piece(f"{pre_}attn{i}", attend_resident, (q, rec), (o_kv, l_kv), True, g))
    elif group is None:
        out.append(Piece(f"attn{i}", attend, (q, rec), (o_kv, l_kv), False))
    else:
        out += [Piece(f"{pre_}launch{i}", launch, (q, rec), (), False, g),
                Piece(f"{pre_}finish{i}", finish, (), (o_kv, l_kv), False, g, waits=True)]
    if split_experts and getattr(ffn, "cpu_experts", None) is not None:
        return out + [post_piece,
                      Piece(f"{pre_}ffn{i}", mlp_launch, (h,), (), ffn_safe, g, pending=calls),
                      Piece(f"{pre_}moe{i}", mlp_finish, (), (dx,), ffn_safe, g, waits=True)]
    return out + [post_piece, Piece(f"{pre_}ffn{i}", mlp, (h,), (dx,), ffn_safe, g)]


def _ends(model, group: int | None = None) -> tuple[Piece, Piece]:
    """The embedding (and rotary tables) and the final norm, for the step or one sub-batch."""
    m, rot = model.model, model.rotary
    g = 0 if group is None else group
    pre_ = "" if group is None else f"{group}:"
    ids, pos, x, cos, sin, out, dx = (pre_ + k for k in ("ids", "pos", "x", "cos", "sin", "out",
                                                         "dx"))

    def embed(env, ctx):
        env[x] = m.embed_tokens(env[ids])
        env[cos], env[sin] = rot.cos_sin(env[pos])

    def norm(env, ctx):
        env[out] = m.norm.add_forward(env[x], env[dx])[1]  # the last MLP's output added

    return (Piece(f"{pre_}embed", embed, (ids, pos), (x, cos, sin), True, g),
            Piece(f"{pre_}norm", norm, (x, dx), (out,), True, g))


def decode_pieces(model, n: int, cache, resident: bool = False) -> list[Piece]:
    """The model's forward pass for ``n`` new tokens, one per sequence, as pieces (equal to
    ``model.forward`` over ``cache``). ``resident``: attention through the cache's fixed
    buffers (graph-safe; see :func:`_layer_pieces`)."""
    embed, norm = _ends(model)
    pieces = [embed]
    for i, layer in enumerate(model.model.layers):
        pieces += _layer_pieces(i, layer, n, cache, resident=resident)
    pieces.append(norm)
    return pieces


def pipelined_pieces(model, sizes: list[int], cache, resident: bool = False,
                     split_experts: bool = False) -> list[Piece]:
    """The forward pass of a decode step split into two sub-batches of ``sizes`` tokens, in the
    order that overlaps one sub-batch's CPU work with the other's GPU work (NEO's asymmetric
    pipelining, arXiv 2411.01142; the schedule here is ours): each sub-batch's pieces run up to
    the next piece that waits for the CPU, then the other's (:func:`interleave`). With CPU
    attention::

        A.pre0 A.launch0 | B.pre0 B.launch0 | A.finish0 A.post0 A.ffn0 A.pre1 A.launch1 |
        B.finish0 B.post0 B.ffn0 B.pre1 B.launch1 | A.finish1 ...

    While the CPU attends A's layer ``i`` the device runs B's dense work from layer ``i-1`` to
    ``i`` (and the device's wait for A's CPU result comes after it); then the CPU attends B's
    layer ``i`` while the device runs A's. ``split_experts``: routed experts on the CPU are
    waited for in the same way (``ffn``/``moe`` pieces): while the CPU computes A's experts of
    one CPU layer, the device runs B's layers up to that layer's router, then A's up to the next
    CPU layer's while the CPU computes B's. ``resident``: attention through each sub-batch's
    fixed buffers (``cache.attend_resident``), so that every piece may be captured."""
    if len(sizes) != 2:
        raise ValueError(f"a pipelined step has two sub-batches, got {sizes}")
    layers = list(model.model.layers)
    lists = []
    for g in (0, 1):
        embed, norm = _ends(model, g)
        body = [p for i, l in enumerate(layers)
                for p in _layer_pieces(i, l, sizes[g], cache, g, resident, split_experts)]
        lists.append([embed] + body + [norm])
    return interleave(lists)


def interleave(lists: list[list[Piece]]) -> list[Piece]:
    """The sub-batches' piece lists in turns: each turn runs one list from where it stopped up
    to (not including) its next piece that waits for the CPU (:attr:`Piece.waits`)."""
    out: list[Piece] = []
    at = [0] * len(lists)
    while any(a < len(l) for a, l in zip(at, lists)):
        for g, l in enumerate(lists):
            a = at[g]
            while a < len(l) and (a == at[g] or not l[a].waits):
                out.append(l[a])
                a += 1
            at[g] = a
    return out


#: a run of graph-safe pieces is cut into graphs of at most this many layers (0: no limit), so
#: that the device starts on the first while the host launches the next. A whole-step graph's
#: launch is host time before any of its work starts (cudaGraphLaunch: 3.0-3.5 ms a step for
#: DeepSeek-V2-Lite's resident step, 5.5 ms for Qwen3-30B-A3B's with graphed CPU expert calls,
#: against 9-47 ms of device work; 2026-12-03 on the H200). Cut every 3-4 layers, resident steps
#: ran 0-6% faster there (DeepSeek-V2-Lite 4 x 32K 12.14 / 12.04 / 12.35 against 12.97 / 12.07 /
#: 12.90 ms, Qwen3-30B-A3B 2 x 32K 12.97 against 13.51, Qwen3 1 x 1K with graphed CPU expert
#: calls 58.3 against 61.4), every layer 4% slower (more launches): 2026-12-03e calls 2-3.
#: ``WRITESCOPE_GRAPH_SEGMENT_LAYERS`` overrides it.
SEGMENT_LAYERS = 4


def segment_layers() -> int:
    """``WRITESCOPE_GRAPH_SEGMENT_LAYERS`` when set (an integer >= 0), else
    :data:`SEGMENT_LAYERS`."""
    text = os.environ.get("WRITESCOPE_GRAPH_SEGMENT_LAYERS", "").strip()
    if not text:
        return SEGMENT_LAYERS
    if not text.isdigit():
        raise ValueError(f"WRITESCOPE_GRAPH_SEGMENT_LAYERS must be an integer >= 0, not {text!r}")
    return int(text)


def _starts_layer(p: Piece) -> bool:
    return p.name.rsplit(":", 1)[-1].startswith("pre")


def segments(pieces: list[Piece], max_layers: int | None = None) -> list[Segment]:
    """Runs of pieces that are all graph-safe or all eager (and of one sub-batch), a graph-safe
    run cut before a layer's first piece once it holds ``max_layers`` layers (default
    :func:`segment_layers`; 0: never cut)."""
    if max_layers is None:
        max_layers = segment_layers()
    out: list[Segment] = []
    layers = 0  # layers begun in the last segment
    for p in pieces:
        same = out and out[-1].graphable == p.graphable and out[-1].group == p.group
        if same and p.graphable and max_layers and _starts_layer(p) and layers >= max_layers:
            same = False
        if same:
            out[-1].pieces.append(p)
        else:
            out.append(Segment([p]))
            layers = 0
        layers += _starts_layer(p)
    return out


def supported(model) -> bool:
    return all(hasattr(l.self_attn, "pre") and hasattr(l.self_attn, "post")
               for l in model.model.layers)


class DecodeGraphs:
    """Per step size: the segments, captured after the first eager step of that size."""

    def __init__(self, model, device: torch.device, cache, mode_: str | None = None):
        self.model = model
        self.cache = cache
        self.device = torch.device(device)
        #: "on", "off" or "pieces": ``mode_`` where given (the engine's enforce_eager), else
        #: WRITESCOPE_CUDA_GRAPHS (:func:`mode`)
        self.mode = mode_ or mode()
        cpu_experts_graph.mode()  # a bad WRITESCOPE_CPU_EXPERTS_GRAPHED fails here, not mid-step
        self.plans: dict[tuple, list[Segment]] = {}  # (sizes, split experts, resident key)
        self._pending: tuple[int, list[Segment]] | None = None
        self._pool = None
        self.disabled_reason: str | None = None
        self._resident_ok: dict[int, bool] = {}  # per step size: every ffn piece graph-safe
        self.counters = {"graphs.captured_sizes": 0, "graphs.replayed_steps": 0,
                         "graphs.pipelined_steps": 0, "graphs.resident_steps": 0,
                         "graphs.segments": 0, "graphs.capture_s": 0.0,
                         "graphs.cpu_expert_calls": 0}

    def resident_rows(self, n: int) -> int | None:
        """The rows a graphed decode step of ``n`` tokens runs in when its attention may be
        captured with the rest (a resident step, ``cache.begin_step``): only where every other
        piece is graph-safe too, so that the whole step is one graph. None otherwise.

        Experts on the CPU count as graph-safe only when their calls are graphed
        (``cpu_experts_graph``, opt-in). Otherwise their steps stay on the hybrid path. Resident
        attention captured around eager expert calls (``WRITESCOPE_RESIDENT_ATTENTION=force``)
        diverged from the eager tokens until each capture's warm-up ran on the eager step's
        inputs (2026-12-03e); since then it gives the eager tokens, but its steps were 6-9%
        slower (Qwen3-30B-A3B 1 x 1K on the H200, 2026-12-03f call 1)."""
        if not self.wants(n):
            return None
        size = bucket(n)
        from ..kvcache.resident_steps import resident_mode
        if resident_mode() == "force":  # the tests' switch: pieces with eager experts too
            return size
        ok = self._resident_ok.get(size)
        if ok is None:
            safe = [getattr(l.ffn, "graph_safe", None) for l in self.model.model.layers]
            ok = self._resident_ok[size] = all(f is None or f(size, True) for f in safe)
        return size if ok else None

    def wants(self, n: int) -> bool:
        if self.mode == "off" or self.disabled_reason or not 1 <= n <= MAX_GRAPH_TOKENS:
            return False
        return self.mode == "pieces" or self.device.type == "cuda"

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx,
            groups: list[int] | None = None, resident: tuple | None = None,
            split_experts: bool = False) -> torch.Tensor:
        """The forward pass of a decode step of ``n = len(input_ids)`` tokens: final-normed
        hidden states as ``model.forward`` returns them, in the first ``n`` of ``bucket(n)``
        rows. ``groups``: tokens per sub-batch of a pipelined step (two, in batch order; the
        step's attention was planned in the same groups); the result then has ``n`` rows.
        ``resident``: the step's key in the cache's resident buffers (``cache.step_resident``,
        loaded for ``bucket(n)`` rows; in a pipelined step one key per sub-batch, loaded for
        ``bucket`` of its tokens): its attention is captured with the rest, and the graphs are
        captured anew whenever the key changes (the buffers grew). ``split_experts``: in a
        pipelined step, the other sub-batch's work also runs while the CPU computes a
        sub-batch's routed experts (:func:`pipelined_pieces`)."""
        n = input_ids.shape[0]
        if groups is not None and len(groups) > 1:
            counts = [int(c) for c in groups]
            env, r = {}, 0
            for g, c in enumerate(counts):
                env[f"{g}:ids"], env[f"{g}:pos"] = input_ids[r:r + c], positions[r:r + c]
                r += c
        else:
            counts = [n]
            env = {"ids": input_ids, "pos": positions}
        sizes = [bucket(c) for c in counts]
        split_experts = bool(split_experts) and len(sizes) > 1
        if resident is not None:
            keys = [resident] if len(sizes) == 1 else list(resident)
            if len(keys) != len(sizes) or any(k[0] != s for k, s in zip(keys, sizes)):
                raise ValueError(f"a resident step of {counts} tokens loaded for "
                                 f"{[k[0] for k in keys]} rows")
            for k in [k for k in self.plans if k[:2] == (tuple(sizes), split_experts)
                      and k[2] is not None and k[2] != resident]:
                del self.plans[k]  # captured over buffers that have since been replaced
            self._forget_pool_if_unused()
        key = (tuple(sizes), split_experts, resident)
        segs = self.plans.get(key)
        if segs is None:  # eagerly, padded to the size (and kept as the capture's inputs)
            pieces = (decode_pieces(self.model, sizes[0], self.cache, resident is not None)
                      if len(sizes) == 1 else
                      pipelined_pieces(self.model, sizes, self.cache, resident is not None,
                                       split_experts))
            segs = segments(pieces)
            for seg in segs:
                if not seg.graphable:
                    seg.run_rows(env, ctx, counts[seg.group])
                    continue
                for k in seg.inputs:
                    env[k] = _padded(env[k], sizes[seg.group])
                if self.mode == "on":
                    seg.static_in = {k: env[k].clone() for k in seg.inputs}
                seg.run_eager(env, ctx)
            if self.mode == "on":
                self._pending = (key, segs)
            return self._output(env, counts)
        for seg in segs:
            if seg.graph is None:
                seg.run_rows(env, ctx, counts[seg.group])
                continue
            for k, buf in seg.static_in.items():
                v = env[k]
                if v is not buf:  # rows past n keep what they held: padding
                    buf[:v.shape[0]].copy_(v)
            for call in seg.host_calls:
                call.submit(counts[seg.group])
            self.counters["graphs.cpu_expert_calls"] += len(seg.host_calls)
            seg.graph.replay()
            env.update(seg.static_out)
        self.counters["graphs.replayed_steps"] += 1
        if len(counts) > 1:
            self.counters["graphs.pipelined_steps"] += 1
        if resident is not None:
            self.counters["graphs.resident_steps"] += 1
        return self._output(env, counts)

    @staticmethod
    def _output(env: dict, counts: list[int]) -> torch.Tensor:
        if len(counts) == 1:
            return env["out"]
        return torch.cat([env[f"{g}:out"][:c] for g, c in enumerate(counts)])

    @property
    def has_pending(self) -> bool:
        """Whether a step size ran eagerly and waits to be captured (:meth:`capture_pending`)."""
        return self._pending is not None

    def drop_pending(self) -> None:
        """The step failed: do not capture from its inputs, and forget the CPU-expert calls it
        launched and never finished."""
        self._pending = None
        self._clear_calls()

    def _clear_calls(self) -> None:
        for segs in self.plans.values():
            for seg in segs:
                for p in seg.pieces:
                    if p.pending is not None:
                        p.pending.clear()

    def stats(self) -> dict:
        out = dict(self.counters, **{"graphs.mode": self.mode if not self.disabled_reason
                                     else f"off ({self.disabled_reason})"})
        experts = [l.ffn.cpu_experts for l in self.model.model.layers
                   if getattr(l.ffn, "cpu_experts", None) is not None]
        if experts:  # whether their calls are captured (cpu_experts_graph), or why not
            why = next((e.graph_disabled for e in experts if e.graph_disabled), None)
            out["graphs.cpu_experts_graphed"] = (
                f"off ({why})" if why else {"auto": "resident steps"}.get(
                    cpu_experts_graph.mode(), cpu_experts_graph.mode()))
        return out

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
            for seg in segs:
                for p in seg.pieces:
                    if p.pending is not None:
                        p.pending.clear()
            if self._graphed_experts(segs):
                # graphed CPU expert calls in it: those go back to eager calls (the graphs of
                # the rest are captured anew, around them, after the next step of this size)
                for l in self.model.model.layers:
                    if getattr(l.ffn, "cpu_experts", None) is not None:
                        l.ffn.cpu_experts.graph_disabled = f"{type(e).__name__}: {e}"
                self.plans.clear()
                self._forget_pool_if_unused()
                self._resident_ok.clear()
                warnings.warn(f"CUDA graph capture with graphed CPU expert calls failed "
                              f"({type(e).__name__}: {e}); those calls run eagerly from now on",
                              RuntimeWarning, stacklevel=2)
                return
            self.disabled_reason = f"{type(e).__name__}: {e}"
            self.plans.clear()
            self._forget_pool_if_unused()
            warnings.warn(f"CUDA graph capture failed ({self.disabled_reason}); decode steps run "
                          "eagerly (WRITESCOPE_CUDA_GRAPHS=0 silences this)", RuntimeWarning,
                          stacklevel=2)
            return
        self.plans[n] = segs
        self.counters["graphs.captured_sizes"] = len(self.plans)
        self.counters["graphs.segments"] += sum(s.graph is not None for s in segs)
        self.counters["graphs.capture_s"] += time.perf_counter() - t0

    def _graphed_experts(self, segs: list[Segment]) -> bool:
        """Whether these segments would capture CPU expert calls (graph-safe ffn pieces of
        layers whose experts are on the CPU)."""
        if cpu_experts_graph.mode() == "off":
            return False
        ffn = {f"ffn{i}" for i, l in enumerate(self.model.model.layers)
               if getattr(l.ffn, "cpu_experts", None) is not None
               and l.ffn.cpu_experts.graph_disabled is None}
        return any(p.name.split(":")[-1] in ffn for s in segs if s.graphable for p in s.pieces)

    def _forget_pool_if_unused(self) -> None:
        """Once no captured graph is left (all dropped: the resident buffers grew, or a capture
        failed), the next capture starts a memory pool of its own. The allocator releases a
        pool when its last graph goes and asserts (``use_count > 0``) when a capture asks for
        it again: a batch-1 run whose graphs were all resident captured nothing after its
        buffers first grew (sixty-fourth session, DeepSeek-V2-Lite 1 x 8K after a 1K warm-up,
        once block-completing steps were resident too; before, their own graphs kept the pool)."""
        if not any(s.graph is not None for segs in self.plans.values() for s in segs):
            self._pool = None

    def _capture(self, segs: list[Segment]) -> None:
        torch.cuda.synchronize(self.device)
        if self._graphed_experts(segs):
            cpu_experts_graph.prepare(self.device)
        writer: dict[str, torch.Tensor | None] = {}  # key -> static output of its last graph
        side = _warmup_stream(self.device)
        for seg in segs:
            if not seg.graphable:
                for k in seg.outputs:
                    writer[k] = None
                continue
            # the warm-up runs on the eager step's values of the inputs: a piece with side
            # effects (resident attention writes the step's token into the KV buffers) then
            # writes what the eager step wrote, where an earlier graph's output buffer holds
            # nothing yet (2026-12-03e call 2: resident steps cut into several graphs
            # decoded other tokens than eager ones before this)
            warm = dict(seg.static_in)
            for k in seg.inputs:  # produced by an earlier graph: read it in place
                if writer.get(k) is not None:
                    seg.static_in[k] = writer[k]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), cpu_experts_graph.reserving():
                seg.run_eager(warm, None)  # warm-up (allocator, cuBLAS, Triton)
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            env = dict(seg.static_in)
            cpu_experts_graph.take_captured()
            with torch.cuda.graph(g, pool=self._pool, capture_error_mode="thread_local"):
                seg.run_eager(env, None)
            seg.host_calls = cpu_experts_graph.take_captured()
            if self._pool is None:
                self._pool = g.pool()
            seg.graph = g
            seg.static_out = {k: env[k] for k in seg.outputs}
            for k in seg.outputs:
                writer[k] = seg.static_out[k]
        torch.cuda.synchronize(self.device)
