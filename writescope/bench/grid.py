"""``writescope bench``: every model x batch x context x KV policy (and the peers) in one run.

For each model one engine is built (weights once); each policy then gets a fresh KV cache of the
same layout (:func:`swap_kv_policy`), and each (batch, context) row runs ``batch`` seeded random
prompts of ``context`` tokens through prefill and then ``decode_steps`` timed decode steps
(:func:`writescope.bench.row.run_engine_row`, whose module describes a row's fields). The grid
adds to each row the roofline model's terms for it (:func:`model_terms`).

With ``rounds`` > 1 the policies' rows run again, each round in the reverse order of the last,
and every row carries its ``round``: the report pairs each writescope row with the others of
its round (:func:`writescope.bench.report.summarize`), so a drift of the machine between rows
weighs on both sides of a ratio.

``static`` gets its CPU share once per model: the roofline's best share for the largest batch
of sequences of ``static_ref_length`` tokens (default: the grid's longest context, where the
policies differ most; :func:`~writescope.planner.roofline.target_share`), unless
``static_share`` is given -- HGCA/FlexGen-style, chosen once and never adapted. (Until the ninth
session the reference was 32K; with experts on the CPU nothing spills there, so ``static`` was
``transfer`` at every length.)

A configuration that cannot run (does not fit a budget, runs out of memory, a kernel error) is a
row with ``error`` and the grid goes on. ``results.json`` is rewritten after every row, so an
interrupted run keeps what it measured; the markdown table, the plots and the summary
(:mod:`writescope.bench.report`) come at the end.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .host_budgets import default_host_budgets, host_memory_summary
from .provenance import git_info
from .row import (RowFailed, _free_memory, make_prompts, percentile, run_engine_row,
                  spread_lengths, token_digest, warm_up)
from .row_terms import experts_where, model_terms, static_share_from_profile

DEFAULT_POLICIES = ("writescope", "transfer", "cpu", "static", "migrate")


@dataclass
class GridSpec:
    models: list[str]
    batches: list[int]
    context_lengths: list[int]
    decode_steps: int = 32
    policies: list[str] = field(default_factory=lambda: list(DEFAULT_POLICIES))
    peers: list[str] = field(default_factory=list)
    out: str = "bench/results/grid"
    random_weights: bool = False
    dtype: str = "bfloat16"
    device: str | None = None
    seed: int = 0
    vram_budget: str | int | None = None
    pinned_budget: str | int | None = None
    host_budget: str | int | None = None
    num_gpu_blocks: int | None = None
    #: device memory for the KV cache (``LLMEngine(kv_cache_memory=)``): ``--experts auto``
    #: places the routed experts around it
    kv_cache_memory: str | int | None = None
    block_size: int | None = None
    experts: str = "auto"
    cpu_threads: int | None = None
    profile: str | None = None
    max_num_batched_tokens: int = 8192
    static_share: float | None = None
    #: the length the static share is chosen at (None: the grid's longest context)
    static_ref_length: int | None = None
    #: the warm-up's long request (None: the shortest context of the grid)
    warmup_length: int | None = None
    #: prompt i of a batch of B is ``length_spread * i // B`` tokens shorter than the row's
    #: context (0: all of it): with a block's worth, the sequences complete their KV blocks on
    #: different steps, as a server's mix does, instead of all on the same one
    length_spread: int = 0
    #: "real": each row prefills its prompts through the model; "synthetic": random KV written
    #: to the homes the placement policy chooses, all but each prompt's last token
    #: (:meth:`LLMEngine.prefill_synthetic`) -- decode rows at long contexts in seconds, no TTFT
    prefill: str = "real"
    peer_offload_weights: bool = False
    #: config.json keys changed for every model (random weights only): the same architecture at
    #: a reduced size, for smoke runs on a small machine; recorded in each model's meta
    config_overrides: dict[str, Any] = field(default_factory=dict)
    #: the policies' rows run this many times, each round in the reverse order of the last
    #: (ABBA...), so that the summary pairs each writescope row with the other policies' rows of
    #: its own round: the host's DRAM bandwidth moves within a run by more than the 3% the
    #: target resolves (2026-12-01c-h200: same-work rows 0.84-2.2x apart)
    rounds: int = 1
    command: str = ""

    def validate(self) -> None:
        if not self.models:
            raise ValueError("give at least one --model")
        if not self.batches or any(b < 1 for b in self.batches):
            raise ValueError("batch sizes must be positive integers")
        if not self.context_lengths or any(n < 1 for n in self.context_lengths):
            raise ValueError("context lengths must be positive")
        if self.decode_steps < 2:
            raise ValueError("--decode-steps must be at least 2")
        if self.warmup_length is not None and self.warmup_length < 2:
            raise ValueError("--warmup-length must be at least 2 tokens")
        if not 0 <= self.length_spread <= min(self.context_lengths) - 2:
            raise ValueError(f"--length-spread must be 0 to {min(self.context_lengths) - 2} "
                             "tokens (each prompt keeps at least 2)")
        if self.length_spread and self.peers:
            raise ValueError("--length-spread is for writescope's rows: the peers run prompts "
                             "of one length")
        if not self.policies:
            raise ValueError("give at least one policy")
        from ..kvcache.placement import check_policy_name
        for p in self.policies:  # a malformed variant or unknown name: before anything is built
            check_policy_name(split_variant(p)[0])
        if self.rounds < 1:
            raise ValueError("--rounds must be at least 1")
        if self.prefill not in ("real", "synthetic"):
            raise ValueError(f"--prefill must be real or synthetic, not {self.prefill!r}")
        if self.prefill == "synthetic" and self.peers:
            raise ValueError("--prefill synthetic gives writescope random KV, so its tokens cannot "
                             "be checked against a peer's: run peers with --prefill real")
        from .peers import PEERS
        for p in self.peers:
            if p not in PEERS:
                raise ValueError(f"unknown peer {p!r}; choose one of {', '.join(PEERS)}")
        if self.static_share is not None and not 0.0 <= self.static_share <= 1.0:
            raise ValueError("--static-share must be in [0, 1]")
        if self.static_ref_length is not None and self.static_ref_length < 1:
            raise ValueError("--static-ref-length must be at least 1 token")
        if self.config_overrides and not self.random_weights:
            raise ValueError("--config-override needs --random-weights (a checkpoint's tensors "
                             "have the published shapes)")
        from ..units import check_byte_flags  # a typo is the command's error, not every row's
        check_byte_flags((("--vram-budget", self.vram_budget),
                          ("--pinned-budget", self.pinned_budget),
                          ("--host-budget", self.host_budget),
                          ("--kv-cache-memory", self.kv_cache_memory)))


# ---------------------------------------------------------------------------------- helpers
def parse_int_list(text: str) -> list[int]:
    from ..units import parse_count
    out = [parse_count(t.strip()) for t in str(text).split(",") if t.strip()]
    if not out:
        raise ValueError(f"empty list: {text!r}")
    return out


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["num_hidden_layers=2,hidden_size=256", "head_dim=128"]`` -> a dict; values are JSON
    (numbers, true/false/null, lists, objects: commas inside brackets, braces or quotes do not
    split, e.g. ``quantization_config={"quant_method":"fp8","weight_block_size":[128,128]}``)
    or else strings."""
    out: dict[str, Any] = {}
    for item in items or []:
        for part in _top_level_split(str(item)):
            if not part.strip():
                continue
            key, sep, val = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"config override {part!r} is not KEY=VALUE")
            try:
                out[key.strip()] = json.loads(val)
            except json.JSONDecodeError:
                out[key.strip()] = val.strip()
    return out


def _top_level_split(text: str, sep: str = ",") -> list[str]:
    """``text`` split at the ``sep`` characters outside brackets, braces and double quotes."""
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def parse_name_list(text: str | list[str]) -> list[str]:
    items = text if isinstance(text, list) else [text]
    out: list[str] = []
    for item in items:
        out.extend(t.strip() for t in str(item).split(",") if t.strip())
    return out


def machine_info() -> dict[str, Any]:
    try:
        from ..planner.profile import machine_description
        return machine_description()
    except ImportError:  # pragma: no cover
        d = {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count()}
        if torch.cuda.is_available():
            d["gpu"] = torch.cuda.get_device_name(0)
        return d


def error_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return f"out of memory: {msg[:300]}"
    return f"{type(e).__name__}: {msg[:300]}"


# ---------------------------------------------------------------------------------- engine
def load_profile(path: str | None, cfg):
    """The hardware profile the bench models with (None without the planner package)."""
    try:
        from ..planner.profile import HardwareProfile, load_or_calibrate
    except ImportError:
        return None
    if path:
        return HardwareProfile.load(path)
    return load_or_calibrate(None, model_config=cfg)


def split_variant(label: str) -> tuple[str, dict[str, float]]:
    """A ``--policies`` entry: a policy name, or a variant of one whose placement policy has
    attributes set, ``name@attr=value[@attr=value...]`` (e.g.
    ``writescope@placement_cpu_margin=1.0``), so that two settings of a knob run in one process,
    round by round, on one machine. Returns the name and the settings."""
    name, *sets = label.split("@")
    out: dict[str, float] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (eq and key.isidentifier() and not key.startswith("_") and math.isfinite(number)):
            raise ValueError(f"policy {label!r}: each setting after '@' is attr=number, not {item!r}")
        out[key] = number
    if not name:
        raise ValueError(f"policy {label!r} has no name before '@'")
    return name, out


def swap_kv_policy(engine, policy: str, *, cpu_share: float) -> None:
    """Give ``engine`` a fresh, empty KV cache of the same layout under ``policy`` (same weights):
    a name, or a variant (:func:`split_variant`) whose settings are set on the new placement
    policy once it is built, before anything is placed (so only attributes it reads as it
    works take effect, as ``placement_cpu_margin`` is); a setting it does not have is an error.
    Three settings belong to the engine instead: ``cpu_threads``, the CPU attention kernel's
    thread count in this cache (``--cpu-threads`` for one policy's rows), ``expert_threads``,
    the CPU routed experts' team size while this policy's rows run (a policy without it runs
    with the engine's own), so that two team sizes alternate round by round in one process, and
    ``expert_link``, the link's share of small decode steps' CPU experts (0: none;
    ``layers/expert_link.py``) while its rows run. Two more switch the engine's steps for a
    policy's rows: ``split_spilled=1`` splits decode steps that stream or attend spilled KV
    into two sub-batches with the experts on the CPU (the runner's
    ``WRITESCOPE_PIPELINE_EXPERTS=all``; ``0``: not, the engine's own setting otherwise), and
    ``team_lock=0|1`` whether the CPU job queues' calls take the cores one at a time
    (``attention.cpu.set_team_lock``)."""
    from ..attention import cpu as cpu_attention
    from ..layers import cpu_experts
    name, sets = split_variant(policy)
    sets = dict(sets)
    split = sets.pop("split_spilled", None)
    lock = sets.pop("team_lock", None)
    for key, value in (("split_spilled", split), ("team_lock", lock)):
        if value is not None and value not in (0, 1):
            raise ValueError(f"policy {policy!r}: {key} must be 0 or 1")
    if split is not None and getattr(engine, "runner", None) is None:
        raise ValueError(f"policy {policy!r}: split_spilled needs the engine's model runner")
    if not hasattr(engine, "bench_team_lock"):
        engine.bench_team_lock = cpu_attention.team_lock()
    cpu_attention.set_team_lock(engine.bench_team_lock if lock is None else bool(lock))
    threads = sets.pop("cpu_threads", None)
    if threads is not None and (threads != int(threads) or threads < 1):
        raise ValueError(f"policy {policy!r}: cpu_threads must be a whole number >= 1")
    experts = sets.pop("expert_threads", None)
    if experts is not None and (experts != int(experts) or experts < 1):
        raise ValueError(f"policy {policy!r}: expert_threads must be a whole number >= 1")
    if not hasattr(engine, "bench_expert_threads"):  # the engine's own setting, before any variant
        engine.bench_expert_threads = cpu_experts.num_threads_setting()
    cpu_experts.set_num_threads(engine.bench_expert_threads if experts is None else int(experts))
    link_share = sets.pop("expert_link", None)
    if link_share is not None and not 0.0 <= link_share <= 1.0:
        raise ValueError(f"policy {policy!r}: expert_link must be a share in [0, 1]")
    link = getattr(engine, "expert_link", None)
    if link is None and link_share:
        raise ValueError(f"policy {policy!r}: expert_link needs routed experts on the CPU")
    if link is not None:
        if not hasattr(engine, "bench_expert_link"):  # the engine's own share
            engine.bench_expert_link = link.share
        link.share = engine.bench_expert_link if link_share is None else float(link_share)
    engine.set_kv_policy(name, cpu_share=cpu_share,
                         cpu_threads=None if threads is None else int(threads))
    runner = getattr(engine, "runner", None)  # (the new cache's runner)
    if runner is not None:
        if not hasattr(engine, "bench_expert_pipeline"):  # the engine's own, before any variant
            engine.bench_expert_pipeline = runner.expert_pipeline
        own = engine.bench_expert_pipeline
        runner.expert_pipeline = own if split is None else (
            "all" if split else ("auto" if own == "all" else own))
    pol = engine.cache.policy
    for key, value in sets.items():
        current = getattr(pol, key, None)
        if not isinstance(current, (int, float)) or isinstance(current, bool):
            raise ValueError(f"policy {policy!r}: {name} has no numeric setting {key!r}")
        setattr(pol, key, type(current)(value))
    _free_memory(engine.device)


def release_kv(engine) -> None:
    """Drop the engine's KV cache (before a peer runs in the same VRAM budget)."""
    engine.cache = engine.scheduler = engine.runner = None
    _free_memory(engine.device)


def _tqdm_write(msg: str) -> None:
    from tqdm.auto import tqdm
    tqdm.write(msg, file=sys.stderr)


def _round_tag(rnd: int | None, rounds: int) -> str:
    """`` (round k of n)`` in the log lines of a run of several rounds."""
    return f" (round {rnd + 1} of {rounds})" if rounds > 1 and rnd is not None else ""


# ---------------------------------------------------------------------------------- the grid
class Grid:
    def __init__(self, spec: GridSpec, log=None, progress: bool = True):
        spec.validate()
        self.spec = spec
        self.out = Path(spec.out)
        self.out.mkdir(parents=True, exist_ok=True)
        # tqdm.write: a line printed while the progress bar is drawn goes above it, not onto
        # the bar's own line
        self.log = log or (lambda msg: _tqdm_write(msg))
        self.progress = progress
        self.rows: list[dict[str, Any]] = []
        self.models_meta: dict[str, Any] = {}
        self.doc = {
            "meta": {
                "command": spec.command or " ".join(shlex.quote(a) for a in sys.argv),
                "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "git": git_info(), "machine": machine_info(),
                "torch": torch.__version__, "spec": asdict(spec),
            },
            "models": self.models_meta, "rows": self.rows, "summary": {},
        }

    # -------------------------------------------------------------- bookkeeping
    def _save(self) -> None:
        path = self.out / "results.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(clean_json(self.doc), indent=1, default=_json_default,
                                  allow_nan=False) + "\n")
        tmp.replace(path)

    def _add(self, row: dict[str, Any], bar) -> None:
        from .report import markdown, summarize
        self.rows.append(row)
        self.doc["summary"] = summarize(self.rows)
        self._save()
        (self.out / "results.md").write_text(markdown(self.doc))  # plots come at the end
        if bar is not None:  # the postfix first: the update draws it with the row it counts
            tps = row.get("decode_tokens_per_s")
            bar.set_postfix_str(f"{row['model']} b{row['batch']} {row['context']} {row['policy']}: "
                                + (f"{tps:.1f} tok/s" if tps else "failed"), refresh=False)
            bar.update(1)
        if row.get("error"):
            self.log(f"[bench] {row['model']} batch {row['batch']} ctx {row['context']} "
                     f"{row['policy']}{_round_tag(row.get('round'), self.spec.rounds)}: "
                     f"{row['error']}")
        elif not self.progress:
            self.log(f"[bench] {row['model']} batch {row['batch']} ctx {row['context']} "
                     f"{row['policy']}{_round_tag(row.get('round'), self.spec.rounds)}: "
                     f"{row.get('decode_tokens_per_s') or 0:.1f} tok/s, p50 "
                     f"{1e3 * (row.get('p50_step_s') or 0):.1f} ms, "
                     + ("no TTFT (synthetic prefill)" if row.get("ttft_s") is None
                        else f"TTFT {row['ttft_s']:.1f} s")
                     + f", CPU share {row.get('cpu_share_mean') or 0:.2f}")

    def _fail_rows(self, model: str, policy: str, error: str, bar, peer: bool = False,
                   rounds: "range | list[int]" = (0,)) -> None:
        for rnd in rounds:
            for b in self.spec.batches:
                for n in self.spec.context_lengths:
                    self._add({"model": model, "batch": b, "context": n, "policy": policy,
                               "peer": peer, "round": rnd, "error": error}, bar)

    def _fail_model(self, model: str, error: str, bar) -> None:
        """Every row of a model that could not be set up: each policy's in every round, each
        peer's once."""
        s = self.spec
        for pol in s.policies:
            self._fail_rows(model, pol, error, bar, rounds=range(s.rounds))
        for pol in s.peers:
            self._fail_rows(model, pol, error, bar, peer=True)

    # -------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        s = self.spec
        total = (len(s.models) * len(s.batches) * len(s.context_lengths)
                 * (len(s.policies) * s.rounds + len(s.peers)))
        bar = tqdm(total=total, desc="bench", unit="row", disable=not self.progress,
                   dynamic_ncols=True)
        with bar:
            for model in s.models:
                self._run_model(model, bar)
        from .report import summarize, write_report
        self.doc["summary"] = summarize(self.rows)
        self._save()
        write_report(self.doc, self.out)
        return self.doc

    def _run_model(self, model: str, bar) -> None:
        from ..engine.engine import LLMEngine
        from ..engine.model_source import resolve_model

        s = self.spec
        try:
            cfg, _, _ = resolve_model(model, s.random_weights, s.config_overrides)
        except (ValueError, FileNotFoundError) as e:
            self._fail_model(model, error_text(e), bar)
            return
        max_len = max(s.context_lengths) + s.decode_steps + math.ceil(
            max(s.batches) * max(s.context_lengths) / s.max_num_batched_tokens) + max(s.batches) + 8
        if not s.random_weights:  # the longest a checkpoint runs (engine.py)
            max_len = min(max_len, cfg.max_positions, cfg.sliding_window or max_len)
        pinned, host = default_host_budgets(cfg, s, max_len)
        kw = dict(dtype=s.dtype, device=s.device, random_weights=s.random_weights, seed=s.seed,
                  max_num_seqs=max(s.batches), max_model_len=max_len,
                  max_num_batched_tokens=s.max_num_batched_tokens, vram_budget=s.vram_budget,
                  pinned_budget=pinned, host_budget=host,
                  num_gpu_blocks=s.num_gpu_blocks, kv_policy="transfer", experts=s.experts,
                  kv_cache_memory=s.kv_cache_memory,
                  cpu_threads=s.cpu_threads, profile=s.profile,
                  config_overrides=s.config_overrides or None,
                  # rows of one model share the engine and their prompts' prefixes: each row
                  # prefills and places its own KV
                  enable_prefix_caching=False)
        if s.block_size is not None:
            kw["block_size"] = s.block_size
        engine = None
        try:
            t0 = time.perf_counter()
            engine = LLMEngine(model, **kw)
            build_s = time.perf_counter() - t0
            # the profile the engine plans with (the given file, or this machine's)
            profile = getattr(engine, "profile", None) or load_profile(s.profile, cfg)
        except Exception as e:  # noqa: BLE001 -- any build failure is this model's rows' reason
            self.log(traceback.format_exc())
            self._fail_model(model, f"engine: {error_text(e)}", bar)
            return
        vram_budget = engine.vram_budget
        if s.static_share is not None:
            static_share, static_why = s.static_share, "--static-share"
        else:
            static_share, static_why = static_share_from_profile(
                profile, cfg, engine, s.static_ref_length or max(s.context_lengths),
                max(s.batches))
        layout = engine.cache.layout
        self.models_meta[model] = {
            "model_type": cfg.model_type, "engine_build_s": build_s,
            "config_overrides": dict(s.config_overrides),
            "engine_build_times": dict(getattr(engine, "build_times", {})),
            "vram_budget": vram_budget, "weights_device_bytes": engine.weights_bytes,
            "experts_on_cpu_layers": sum(engine.cpu_expert_layers),
            # the engine's reserve for its largest step, and the layers whose experts it moved
            # to the CPU once that was measured (LLMEngine._fit_experts_around_kv)
            "max_model_len": engine.max_model_len,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "activation_bytes": engine.activation_bytes, "buffer_bytes": engine.buffer_bytes,
            "experts_moved_layers": engine.experts_moved_layers,
            # --kv-cache-memory (auto: the planner's split and its predicted step)
            "kv_cache_memory": getattr(engine, "kv_cache_memory", None),
            "kv_split": getattr(engine, "kv_split", None),
            "block_size": engine.cache.bs, "block_bytes": engine.cache.block_bytes,
            "kv_capacity_blocks": {str(r): n for r, n in layout.num_blocks.items()},
            "kv_bytes_per_token": cfg.kv_bytes_per_token(engine.dtype),
            "static_share": static_share, "static_share_from": static_why,
            "profile": (None if profile is None else
                        {"machine": profile.machine, "created": profile.created,
                         "quick": profile.quick, "path": s.profile}),
        }
        parts = ", ".join(f"{k[:-2]} {v:.1f} s"
                          for k, v in getattr(engine, "build_times", {}).items())
        host = host_memory_summary(engine)
        self.models_meta[model]["host_memory"] = host
        self.log(f"[bench] {model}: built in {build_s:.1f} s ({parts}); G/T/C/W blocks "
                 f"{ {str(r): n for r, n in layout.num_blocks.items()} }; static share "
                 f"{static_share:.3f} ({static_why}); host: "
                 + ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in host.items() if v is not None))
        ws_tokens: dict[tuple[int, int], list[list[int]]] = {}
        for rnd in range(s.rounds):
            for policy in (s.policies if rnd % 2 == 0 else s.policies[::-1]):
                self._run_policy(engine, model, cfg, profile, policy, static_share, vram_budget,
                                 rnd, ws_tokens, bar)
        if hasattr(engine, "bench_expert_threads"):  # a variant's experts' team ends with its rows
            from ..layers import cpu_experts
            cpu_experts.set_num_threads(engine.bench_expert_threads)
        if hasattr(engine, "bench_expert_link") and engine.expert_link is not None:
            engine.expert_link.share = engine.bench_expert_link  # (and its link share)
        if hasattr(engine, "bench_expert_pipeline"):  # (its steps' form)
            engine.runner.expert_pipeline = engine.bench_expert_pipeline
        if hasattr(engine, "bench_team_lock"):  # (and the CPU queues' lock)
            from ..attention import cpu as cpu_attention
            cpu_attention.set_team_lock(engine.bench_team_lock)
        for peer_name in s.peers:
            self._run_peer(engine, model, cfg, peer_name, vram_budget, ws_tokens, bar)
        del engine
        _free_memory(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))

    def _run_policy(self, engine, model, cfg, profile, policy, static_share, vram_budget, rnd,
                    ws_tokens, bar) -> None:
        """One policy's rows of one round: a fresh cache under ``policy``, its warm-up, then
        every (batch, context) row."""
        s = self.spec
        base = split_variant(policy)[0]  # a variant's rows are modelled as its policy's
        try:
            swap_kv_policy(engine, policy, cpu_share=static_share)
        except Exception as e:  # noqa: BLE001
            self._fail_rows(model, policy, f"policy: {error_text(e)}", bar, rounds=(rnd,))
            return
        t_warm, tag = time.perf_counter(), _round_tag(rnd, s.rounds)
        try:
            warm_up(engine, cfg.vocab_size, s.seed, s.warmup_length or min(s.context_lengths),
                    s.batches)
            if not self.progress:  # (no progress bar: a line per stage says where time goes)
                self.log(f"[bench] {model} {policy}{tag}: warm-up "
                         f"{time.perf_counter() - t_warm:.1f} s"
                         + ("" if not hasattr(engine.cache.policy, "cpu_verified") else
                            ", the planner's CPU attention rate "
                            + ("measured" if engine.cache.policy.cpu_verified else
                               "not measured yet (no timed step with CPU attention)")))
        except Exception as e:  # noqa: BLE001 -- the rows will say what is wrong
            self.log(f"[bench] {model} {policy}{tag}: warm-up failed: {error_text(e)}")
            _free_memory(engine.device)
        for b in s.batches:
            for n in s.context_lengths:
                row = {"model": model, "batch": b, "context": n, "policy": policy, "peer": False,
                       "round": rnd, "experts": experts_where(engine),
                       # whether the planner had measured its CPU path when the row began
                       "planner_verified": getattr(engine.cache.policy, "cpu_verified",
                                                   None)}
                prompts = spread_lengths(make_prompts(cfg.vocab_size, b, n, s.seed),
                                         s.length_spread)
                if s.length_spread:
                    row["prompt_lengths"] = [len(p) for p in prompts]
                try:
                    row.update(run_engine_row(engine, prompts, s.decode_steps, vram_budget,
                                              f"{policy}-{b}-{n}", s.prefill, s.seed))
                    row.update(model_terms(profile, cfg, engine, base, b, n, s.decode_steps,
                                           static_share, row.get("cpu_expert_bytes_measured"),
                                           [len(p) for p in prompts]))
                    if row.get("roofline_bound_s") and row.get("mean_step_s"):
                        row["bound_efficiency"] = row["roofline_bound_s"] / row["mean_step_s"]
                    if policy == "writescope":  # the peers' tokens are checked against these
                        ws_tokens.setdefault((b, n), row["output_token_ids"])
                except Exception as e:  # noqa: BLE001 -- a failed row, the grid goes on
                    if not isinstance(e, (RowFailed, torch.cuda.OutOfMemoryError, MemoryError)):
                        self.log(traceback.format_exc())
                    row["error"] = error_text(e) if not isinstance(e, RowFailed) else str(e)
                    _free_memory(engine.device)
                self._add(row, bar)

    def _run_peer(self, engine, model, cfg, peer_name, vram_budget, ws_tokens, bar) -> None:
        from .peers import first_divergence, make_peer

        s = self.spec
        try:
            release_kv(engine)
            # the last peer may take the engine's host-memory experts apart (the engine is done)
            peer = make_peer(peer_name, engine, vram_budget, s.peer_offload_weights,
                             consume_engine=peer_name == s.peers[-1])
        except Exception as e:  # noqa: BLE001
            self._fail_rows(model, peer_name, error_text(e), bar, peer=True)
            return
        try:
            for b in s.batches:
                for n in s.context_lengths:
                    row = {"model": model, "batch": b, "context": n, "policy": peer_name,
                           "peer": True, "experts": experts_where(engine),
                           "peer_cache": peer.cache_impl,
                           "peer_weights": peer.weights_placement}
                    if peer.note:
                        row["note"] = peer.note
                    try:
                        if n + s.decode_steps + 1 > engine.max_model_len:
                            raise RowFailed(f"{n} + {s.decode_steps} tokens exceed max_model_len "
                                            f"{engine.max_model_len}")
                        r = peer.run(make_prompts(cfg.vocab_size, b, n, s.seed), s.decode_steps)
                        steps = r["step_times_s"]
                        total = sum(steps)
                        peak = r["peak_vram_bytes"]
                        row.update({
                            "ttft_s": r["ttft_s"], "decode_tokens_per_s": b * len(steps) / total,
                            "mean_step_s": total / len(steps), "p50_step_s": percentile(steps, 50),
                            "p99_step_s": percentile(steps, 99), "step_times_s": steps,
                            "peak_vram_bytes": peak, "vram_budget": vram_budget,
                            "weights_device_bytes": peer.weight_bytes, "bytes_moved": None,
                            "output_digest": token_digest(r["output_token_ids"]),
                            "output_token_ids": r["output_token_ids"]})
                        ref = ws_tokens.get((b, n))
                        if ref is not None:
                            same = sum(a == c for a, c in zip(ref, r["output_token_ids"]))
                            row["same_tokens_as_writescope"] = same / b
                            row["first_divergence"] = first_divergence(
                                ref, r["output_token_ids"], r["logprobs"])
                        if peak is not None and peak > vram_budget:
                            row["error"] = (f"over the VRAM budget: peak {peak / 2**30:.2f} GiB > "
                                            f"{vram_budget / 2**30:.2f} GiB")
                    except Exception as e:  # noqa: BLE001
                        if not isinstance(e, (RowFailed, torch.cuda.OutOfMemoryError, MemoryError)):
                            self.log(traceback.format_exc())
                        row["error"] = str(e) if isinstance(e, RowFailed) else error_text(e)
                        _free_memory(engine.device)
                    self._add(row, bar)
        finally:
            peer.close()


def clean_json(o):
    """JSON-safe copy: non-finite floats become null (strict JSON has no NaN)."""
    if isinstance(o, dict):
        return {str(k): clean_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean_json(v) for v in o]
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else None
    if isinstance(o, np.integer):
        return int(o)
    return o


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def run_grid(spec: GridSpec, log=None, progress: bool = True) -> dict[str, Any]:
    """Run the whole grid; returns the results document (also written to ``spec.out``)."""
    return Grid(spec, log=log, progress=progress).run()
