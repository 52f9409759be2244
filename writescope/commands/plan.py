"""``writescope plan``: predicted CPU share and step time against context length, per policy.

    writescope plan --model qwen3-30b-a3b --profile bench/profiles/h200.json --batch 8 \\
        --context-lengths 1k,4k,16k,64k,128k --vram-budget 32GiB --json plan.json --plot plan.png

For each context length (every sequence of the batch that long) and each policy the roofline
(:mod:`writescope.planner.roofline`) predicts the decode step in steady state: ``transfer``
streams every spilled block, ``cpu`` attends every spilled block on the CPU, ``static`` keeps one
share chosen once from the hardware alone (by default the bandwidth ratio
``B_cpu / (B_cpu + B_pcie)``, the share long sequences tend to), ``writescope`` takes the
best share for that length. The roofline bound is the step with spilled KV read at the sum of
the concurrent H2D and CPU read ceilings. ``--model`` takes a checkpoint folder or a reference
name (its config ships with the package: no checkpoint needed).

With ``--experts auto`` and a budget it then weighs the routed experts against KV in HBM: per
length, writescope's step with the split planned and with the fastest split of any count of
MoE layers' experts on the CPU, and the engine option that gives it (``--experts cpu``, or the
``--kv-cache-memory`` with which ``auto`` chooses that split). A layer's experts in HBM are
read a few at a time; its bytes as G blocks hold KV that every step reads whole.

JSON: ``{"transfer": [{"context_length", "cpu_share", "predicted_step_s", ...}, ...], "cpu": [...],
"static": [...], "writescope": [...], "roofline_bound": [{"context_length", "step_s"}, ...],
"expert_splits": [{"context_length", "cpu_layers", "step_s", "best_cpu_layers", "best_step_s",
"speedup", "kv_cache_memory", "moe_layers"}, ...] (``--experts auto``), "meta": {...}}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..planner.roofline import Pipelined

POLICIES = ("transfer", "cpu", "static", "writescope")
DEFAULT_LENGTHS = "1k,2k,4k,8k,16k,32k,64k,128k"
#: ``LLMEngine``'s default ``max_num_batched_tokens``
DEFAULT_BATCHED_TOKENS = 2048


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="predicted CPU share and step time per policy",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="PATH|NAME",
                   help="checkpoint folder, deepseek-v2-lite | qwen3-30b-a3b | mixtral-8x7b, or "
                        "writescope-default (the embedded default model)")
    p.add_argument("--profile", metavar="P", help="hardware profile JSON (default: this machine's)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    p.add_argument("--context-lengths", default=DEFAULT_LENGTHS, metavar="L1,L2,...",
                   help=f"tokens per sequence, e.g. 1k,8k,128k (default {DEFAULT_LENGTHS})")
    p.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                   help="change a config.json key before planning, as `writescope bench` does: "
                        "e.g. 'quantization_config={\"quant_method\":\"fp8\","
                        "\"weight_block_size\":[128,128]}' plans an -FP8 release's experts "
                        "(repeatable or comma-separated)")
    p.add_argument("--experts", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where routed experts run (auto: as the engine places them, as many MoE "
                        "layers' experts on the GPU as fit beside the KV of one sequence of the "
                        "longest length, or --kv-cache-memory if more)")
    p.add_argument("--vram-budget", default="32GiB",
                   help="GPU memory the engine may use (default 32GiB; none: no limit, all KV "
                        "in HBM)")
    p.add_argument("--kv-cache-memory", default=None, metavar="SIZE",
                   help="device memory for the KV cache, as the engine's option: --experts auto "
                        "places the routed experts around it, and the G region holds no more; "
                        "auto: the split predicted fastest for the batch at the longest length")
    p.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_BATCHED_TOKENS,
                   metavar="N",
                   help="the engine's option (default %(default)s, the engine's): the activations "
                        "an engine on a GPU keeps for its largest step, estimated "
                        "(planner/activations.py), are the margin the splits leave beside the "
                        "weights and the KV")
    p.add_argument("--static-share", type=_static_share, default=None, metavar="X|longest",
                   help="the static policy's CPU share: a number in [0, 1], or 'longest' for "
                        "writescope's target at the longest context given, as `writescope "
                        "bench` chooses it (default: the CPU/PCIe bandwidth ratio)")
    p.add_argument("--pipeline-experts", choices=("on", "off", "auto"), default=None,
                   help="the form of decode steps with routed experts on the CPU and all KV in "
                        "HBM, as WRITESCOPE_PIPELINE_EXPERTS gives it: on, two interleaved "
                        "sub-batches; off, one batch; auto, the faster of the two (the engine "
                        "measures both). Default: as that variable says (auto unless set)")
    p.add_argument("--json", metavar="F", help="write the predictions as JSON")
    p.add_argument("--plot", metavar="F.png", help="plot share and step time against length")
    p.set_defaults(func=run)


def _static_share(text: str) -> float | str:
    if text.strip().lower() == "longest":
        return "longest"
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1] or 'longest', got {text!r}")
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"a CPU share is in [0, 1], got {x}")
    return x


def make_plan(cfg, profile, batch: int, lengths: list[int], experts_on_cpu,
              vram_budget: int | None, static_share: float | str | None = None,
              kv_cache_memory: int | None = None, reserve_bytes: int | None = None,
              pipelined: "Pipelined" = False) -> dict:
    """The plan as the JSON document ``writescope plan --json`` writes. ``static_share``
    ``"longest"``: writescope's target share for ``batch`` sequences of the longest length, the
    share ``writescope bench`` fixes for its ``static`` rows (``static_share_from`` in the
    document says which). ``experts_on_cpu``: every MoE layer's routed experts on the CPU, none,
    or a flag per layer (``--experts auto``: the engine's choice for the budget).
    ``kv_cache_memory``: the G region holds at most that many bytes of KV; ``reserve_bytes``:
    the device bytes kept beside the weights and the KV (None: the roofline's 1 GiB);
    ``pipelined``: the form of decode steps with CPU experts (``roofline.Pipelined``: ``"on"``,
    two sub-batches where the engine splits them; ``"auto"``, the faster form there)."""
    from ..planner import roofline as rl
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError("context lengths must be positive")
    g_tokens = rl.gpu_kv_capacity_tokens(cfg, vram_budget, experts_on_cpu) \
        if reserve_bytes is None else \
        rl.gpu_kv_capacity_tokens(cfg, vram_budget, experts_on_cpu, reserve_bytes)
    if kv_cache_memory is not None:
        g_tokens = min(g_tokens, kv_cache_memory / (rl.kv_bytes_per_token_layer(cfg)
                                                    * cfg.num_layers))
    if static_share is None:
        static_share = rl.bandwidth_ratio(profile, cfg)
        static_from = "the CPU/PCIe bandwidth ratio"
    elif static_share == "longest":
        ref = max(lengths)
        res = sum(rl.resident_tokens([ref] * batch, g_tokens))
        static_share = rl.target_share(profile, cfg, batch, res, batch * ref - res,
                                       experts_on_cpu, pipelined=pipelined).cpu_share
        static_from = f"writescope's target share at {ref} tokens, batch {batch}"
    else:
        static_from = "given"
    doc: dict = {}
    for policy in POLICIES:
        rows = []
        for n in lengths:
            sp = rl.plan_for_lengths(profile, cfg, [n] * batch, g_tokens, experts_on_cpu, policy,
                                     static_share=static_share, pipelined=pipelined)
            p = sp.prediction
            rows.append({"context_length": n, "cpu_share": round(sp.cpu_share, 6),
                         "predicted_step_s": p.step_s, "tokens_per_s": batch / p.step_s,
                         "cpu_attn_s": p.cpu_attn_s, "pcie_s": p.pcie_s, "gpu_attn_s": p.gpu_attn_s,
                         "expert_s": p.expert_s})
        doc[policy] = rows
    doc["roofline_bound"] = [
        {"context_length": n,
         "step_s": rl.roofline_bound_s(profile, cfg, [n] * batch, g_tokens, experts_on_cpu)}
        for n in lengths]
    kvb = rl.kv_bytes_per_token_layer(cfg) * cfg.num_layers
    doc["meta"] = {
        "model": cfg.raw.get("_name_or_path") or cfg.model_type, "model_type": cfg.model_type,
        "batch": batch, "experts": _experts_where(cfg, experts_on_cpu), "vram_budget": vram_budget,
        "kv_cache_memory": kv_cache_memory, "reserve_bytes": reserve_bytes,
        "gpu_weight_bytes": rl.gpu_weight_bytes(cfg, experts_on_cpu),
        "g_region_tokens": None if g_tokens == float("inf") else int(g_tokens),
        "kv_bytes_per_token": kvb, "static_share": static_share, "static_share_from": static_from,
        "profile_machine": profile.machine, "profile_created": profile.created,
        "cpu_attn_family": rl.attn_family(cfg),
        "pipeline_experts": ((pipelined if isinstance(pipelined, str) else "on")
                             if pipelined and batch >= 2 and
                             rl.cpu_expert_layers(cfg, experts_on_cpu) else "off"),
    }
    return doc


def expert_splits(cfg, profile, batch: int, lengths: list[int], vram_budget: int,
                  experts_on_cpu, kv_cache_memory: int | None = None,
                  margin=lambda n: None, pipelined: "Pipelined" = False) -> list[dict]:
    """Routed experts against KV in HBM (:mod:`writescope.planner.expert_split`), per length:
    writescope's predicted step with ``experts_on_cpu`` (the split planned, its G region capped
    by ``kv_cache_memory``) and with the fastest split the engine can be given for a
    ``max_model_len`` of that length, and the option that gives it. ``margin(n)``: the device
    bytes an engine with ``max_model_len`` ``n`` keeps beside weights and KV
    (``expert_split.Margin``; None: ``auto``'s default margin); ``pipelined``: as
    :func:`make_plan`."""
    from ..planner import expert_split as es
    from ..planner import roofline as rl
    kvb = rl.kv_bytes_per_token_layer(cfg) * cfg.num_layers
    now = len(rl.cpu_expert_layers(cfg, experts_on_cpu))
    rows = []
    for n in lengths:
        m = margin(n)
        best = es.best_split(profile, cfg, [n] * batch, vram_budget, min_kv_bytes=kvb * n,
                             margin_bytes=m, pipelined=pipelined)
        if best is None:
            continue
        cur = es.split_step(profile, cfg, [n] * batch, vram_budget, now, kv_cache_memory,
                            m(now) if callable(m) else m, pipelined)
        rows.append({"context_length": n, "cpu_layers": now, "step_s": cur,
                     "best_cpu_layers": best["cpu_layers"], "best_step_s": best["step_s"],
                     "speedup": (cur / best["step_s"]) if cur else None,
                     "kv_cache_memory": best["kv_cache_memory"],
                     "moe_layers": len(cfg.moe_layers)})
    return rows


def format_splits(rows: list[dict]) -> str:
    from ..units import format_count
    lines = ["routed experts against KV in HBM (writescope's predicted step; --experts auto "
             "places the experts around --kv-cache-memory):",
             f"{'context':>8} {'planned split':>22} {'best split':>22} {'speedup':>8}  engine option"]
    for r in rows:
        m = r["moe_layers"]
        cur = (f"{r['cpu_layers']:>2} of {m} {r['step_s'] * 1e3:>9.2f} ms" if r["step_s"]
               else f"{r['cpu_layers']:>2} of {m} {'-':>12}")
        best = f"{r['best_cpu_layers']:>2} of {m} {r['best_step_s'] * 1e3:>9.2f} ms"
        sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        opt = ("--experts cpu" if r["best_cpu_layers"] == m else
               f"--kv-cache-memory {r['kv_cache_memory'] // 2**20}MiB"
               if r["kv_cache_memory"] else "-")
        lines.append(f"{format_count(r['context_length']):>8} {cur:>22} {best:>22} {sp:>8}  {opt}")
    lines.append("(each split as the engine gives it with --max-model-len at that length: it "
                 "always sets aside one such sequence's KV; --kv-cache-memory auto chooses it. "
                 "The splits keep the activations an engine on the GPU measures, estimated for "
                 "--max-num-batched-tokens (planner/activations.py); where it measures more, it "
                 "moves more layers' experts to the CPU at start-up)")
    return "\n".join(lines)


def _experts_where(cfg, experts_on_cpu) -> str:
    """``cpu``, ``gpu``, or ``cpu in N of M MoE layers`` (``experts="auto"``'s split)."""
    from ..planner import roofline as rl
    n_cpu, n_moe = len(rl.cpu_expert_layers(cfg, experts_on_cpu)), len(cfg.moe_layers)
    if n_cpu == 0:
        return "gpu"
    return "cpu" if n_cpu == n_moe else f"cpu in {n_cpu} of {n_moe} MoE layers"


def format_table(doc: dict) -> str:
    from ..units import format_count
    lines = []
    head = (f"{'context':>8} " + " ".join(f"{p:>19}" for p in POLICIES) + f" {'bound':>9}"
            + f" {'writescope /':>13}")
    lines.append(head)
    lines.append(f"{'':>8} " + " ".join(f"{'share   step ms':>19}" for _ in POLICIES) + f" {'ms':>9}"
                 + f" {'best other':>13}")
    for i, b in enumerate(doc["roofline_bound"]):
        cells = []
        for p in POLICIES:
            r = doc[p][i]
            cells.append(f"{r['cpu_share']:>7.2f} {r['predicted_step_s'] * 1e3:>11.2f}")
        lines.append(f"{format_count(b['context_length']):>8} " + " ".join(cells)
                     + f" {b['step_s'] * 1e3:>9.2f} {best_other_speedup(doc, i):>12.3f}x")
    return "\n".join(lines)


def best_other_speedup(doc: dict, i: int) -> float:
    """Predicted speedup of ``writescope`` over the fastest other policy at length ``i``."""
    ws = doc["writescope"][i]["predicted_step_s"]
    return min(doc[p][i]["predicted_step_s"] for p in POLICIES if p != "writescope") / ws


def plot(doc: dict, path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..units import format_count
    xs = [b["context_length"] for b in doc["roofline_bound"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"transfer": "s--", "cpu": "^--", "static": "d:", "writescope": "o-"}
    for p in POLICIES:
        a1.plot(xs, [r["cpu_share"] for r in doc[p]], styles[p], label=p)
        a2.plot(xs, [r["predicted_step_s"] * 1e3 for r in doc[p]], styles[p], label=p)
    a2.plot(xs, [b["step_s"] * 1e3 for b in doc["roofline_bound"]], "k-", lw=2, alpha=0.4,
            label="roofline bound")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(xs)
        a.set_xticklabels([format_count(x) for x in xs])
        a.set_xlabel("context length per sequence (tokens)")
        a.grid(alpha=0.3)
    a1.set_ylabel("CPU share of spilled KV")
    a1.set_ylim(-0.03, 1.03)
    a2.set_ylabel("predicted decode step (ms)")
    a2.set_yscale("log")
    a1.legend(fontsize=8)
    a2.legend(fontsize=8)
    m = doc["meta"]
    budget = m.get("vram_budget")
    from ..units import format_bytes
    fig.suptitle(title or f"{m['model']}: batch {m['batch']}, experts on {m['experts']}, VRAM "
                 f"budget {'none' if budget is None else format_bytes(budget)}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _git_commit() -> str | None:
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run(args: argparse.Namespace) -> int:
    from ..models.config import ModelConfig
    from ..planner import roofline as rl
    from ..planner.profile import HardwareProfile, load_or_calibrate
    from ..units import format_bytes, is_auto, parse_bytes, parse_count
    if args.batch < 1:  # before a calibration may run
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if args.max_num_batched_tokens < 1:
        raise ValueError(f"--max-num-batched-tokens must be >= 1, got {args.max_num_batched_tokens}")
    # the sizes too: a typo is an error at once, not after calibrating this machine (minutes)
    lengths = [parse_count(x) for x in args.context_lengths.split(",") if x.strip()]
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError(f"--context-lengths must be positive token counts, got "
                         f"{args.context_lengths!r}")
    budget = parse_bytes(args.vram_budget) if args.vram_budget not in (None, "", "none") else None
    if budget is not None and budget <= 0:
        raise ValueError(f"--vram-budget must be positive, got {args.vram_budget!r}")
    auto_kv = is_auto(args.kv_cache_memory)
    kv_memory = parse_bytes(args.kv_cache_memory) if args.kv_cache_memory and not auto_kv else None
    if kv_memory is not None and kv_memory <= 0:
        raise ValueError(f"--kv-cache-memory must be positive, got {args.kv_cache_memory!r}")
    from .common import check_writable
    for flag in ("--json", "--plot"):  # a place no file can go fails now, not after the plan
        if getattr(args, flag[2:]):
            check_writable(flag, getattr(args, flag[2:]), Path(getattr(args, flag[2:])).parent,
                           make=True)
    from ..engine.model_source import config_source
    source = config_source(args.model)
    if args.config_override:
        from ..bench.grid import parse_overrides
        from ..engine.model_source import apply_config_overrides
        from ..models.config import load_config_dict
        cfg = ModelConfig.from_hf(apply_config_overrides(load_config_dict(source),
                                                         parse_overrides(args.config_override)))
    else:
        cfg = ModelConfig.from_hf(source)
    if "_name_or_path" not in cfg.raw:
        cfg.raw["_name_or_path"] = Path(args.model).name or args.model
    profile = HardwareProfile.load(args.profile) if args.profile else load_or_calibrate(model_config=cfg)
    if not profile.has_gpu:  # (this machine's profile, most likely: the CPU stands in for the GPU)
        print(f"note: the profile ({args.profile or 'this machine'}) has no GPU, so the plan runs "
              "every kernel on the CPU; to plan for a GPU machine pass its profile, e.g. "
              "--profile bench/profiles/h200.json", file=sys.stderr)
    if cfg.quantization is not None and args.experts != "gpu" and profile.lacks_fp8_expert_rates:
        print("note: the profile has no FP8 CPU expert rates (calibrated before they were "
              "measured): FP8 experts on the CPU are charged bf16's bytes/s, about 1.2-1.5x "
              "faster than the kernel measured on 16-core hosts; run `writescope calibrate` "
              "for this machine's", file=sys.stderr)
    from ..kvcache.subbatches import expert_pipeline_mode
    # as the engine would run it: WRITESCOPE_PIPELINE_EXPERTS, unless given
    pipelined = rl.expert_form(args.pipeline_experts or expert_pipeline_mode())
    all_gpu = rl.gpu_weight_bytes(cfg, experts_on_cpu=False)

    def margin(n: int):
        """What an engine with max_model_len n keeps beside weights and KV, per CPU layer
        count: estimated on a GPU machine (planner/activations.py), auto's default elsewhere."""
        if budget is None or not profile.has_gpu:
            return None
        from ..planner.expert_split import estimated_margin
        return estimated_margin(cfg, budget, args.max_num_batched_tokens, n)

    if auto_kv:
        # as the engine's kv_cache_memory="auto": the fastest split for the batch at the
        # longest length (planner/expert_split.py)
        from ..planner.expert_split import best_split
        if args.experts != "auto" or budget is None:
            raise ValueError("--kv-cache-memory auto chooses where the routed experts run: it "
                             "needs --experts auto and a --vram-budget")
        n = max(lengths)
        best = best_split(profile, cfg, [n] * args.batch, budget,
                          min_kv_bytes=int(rl.kv_bytes_per_token_layer(cfg) * cfg.num_layers * n),
                          margin_bytes=margin(n), pipelined=pipelined)
        if best is None:
            raise ValueError(f"no split of the routed experts fits the VRAM budget "
                             f"({format_bytes(budget)})")
        kv_memory = best["kv_cache_memory"]
        from ..layers.expert_placement import cpu_layer_order
        experts_on_cpu = frozenset(cpu_layer_order(cfg.moe_layers)[:best["cpu_layers"]])
    elif args.experts == "auto":
        # the engine's choice (layers/expert_placement.py): the KV of one sequence of the
        # longest length (or --kv-cache-memory, if more) first, then as many MoE layers' experts
        # on the GPU as fit
        import torch
        from ..layers.expert_placement import choose_expert_layers
        kv_need = max(int(cfg.kv_bytes_per_token(torch.bfloat16) * max(lengths, default=0)),
                      kv_memory or 0)
        reserve = margin(max(lengths))
        experts_on_cpu = None
        if reserve is not None:
            try:  # the upload buffer takes its room too once any layer's experts are on the CPU
                experts_on_cpu = tuple(choose_expert_layers(
                    cfg, "auto", budget, kv_need, torch.bfloat16, margin_bytes=reserve(0)))
                if any(experts_on_cpu):
                    experts_on_cpu = tuple(choose_expert_layers(
                        cfg, "auto", budget, kv_need, torch.bfloat16, margin_bytes=reserve(1)))
            except ValueError:  # not even with every expert on the CPU: as the engine places
                experts_on_cpu = None  # them before it measures, with auto's margin
        if experts_on_cpu is None:
            experts_on_cpu = tuple(choose_expert_layers(cfg, "auto", budget, kv_need,
                                                        torch.bfloat16))
    else:
        experts_on_cpu = args.experts == "cpu"
    if not rl.cpu_expert_layers(cfg, experts_on_cpu) and budget is not None and all_gpu > budget:
        raise ValueError(f"the model's weights ({format_bytes(all_gpu)}) do not fit the VRAM budget "
                         f"({format_bytes(budget)}); use --experts cpu")
    gpu_bytes = rl.gpu_weight_bytes(cfg, experts_on_cpu)
    if budget is not None and gpu_bytes > budget:  # as the engine refuses it
        raise ValueError(f"the model's weights on the GPU ({format_bytes(gpu_bytes)}, with the "
                         f"routed experts on the CPU) do not fit the VRAM budget "
                         f"({format_bytes(budget)})")
    reserve = margin(max(lengths))
    n_cpu = len(rl.cpu_expert_layers(cfg, experts_on_cpu))
    doc = make_plan(cfg, profile, args.batch, lengths, experts_on_cpu, budget, args.static_share,
                    kv_memory, reserve(n_cpu) if reserve is not None else None, pipelined)
    doc["meta"]["command"] = "writescope " + " ".join(sys.argv[1:])
    doc["meta"]["git_commit"] = _git_commit()
    m = doc["meta"]
    print(f"{m['model']} | batch {args.batch} | experts on {m['experts']} | VRAM budget "
          f"{format_bytes(budget) if budget else 'unlimited'} | G region "
          f"{m['g_region_tokens'] if m['g_region_tokens'] is not None else 'unlimited'} tokens | "
          + (f"reserve {format_bytes(m['reserve_bytes'])} (activations estimated for "
             f"{args.max_num_batched_tokens} batched tokens) | " if m["reserve_bytes"] else "")
          + f"static share {m['static_share']:.2f} ({m['static_share_from']})"
          + {"on": " | steps with CPU experts in two sub-batches",
             "auto": " | steps with CPU experts in the faster of one batch and two sub-batches"}
          .get(m["pipeline_experts"], ""))
    print(format_table(doc))
    if args.experts == "auto" and budget is not None and cfg.moe_layers:
        doc["expert_splits"] = expert_splits(cfg, profile, args.batch, lengths, budget,
                                             experts_on_cpu, kv_memory, margin, pipelined)
        print()
        print(format_splits(doc["expert_splits"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if args.plot:
        plot(doc, args.plot)
    return 0
