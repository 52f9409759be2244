"""``writescope bench`` output: the summary, the markdown table and the plots.

* :func:`summarize` -- per model (per model and experts placement when the rows hold a model
  with its experts in both places: :func:`group_label`), the geometric-mean speedup of ``writescope`` decode throughput
  over every other policy and peer, over the (batch, context) pairs with context >= 8K where both
  ran; plus the two targets of the issue: the worst ratio of ``writescope`` to the best other
  *policy* per pair (target: never more than 3% slower; policies that did writescope's own
  work, :func:`same_work`, are left out of it and their spread reported as the run's noise)
  and the roofline-bound efficiency
  (bound / measured step; target: within 15%, i.e. >= 0.85); and, with routed experts on the
  CPU, the same ratio over the pairs whose spilled KV per decode step exceeds the activated
  experts' weight bytes per step (``kv_over_experts``; target: >= 1.4x, geomean). Rows of
  several rounds (``--rounds``) are paired within their round, and a pair's ratio is the
  median of its rounds' ratios.
* :func:`write_report` -- ``results.md`` (meta, summary -- saying so when no pair reached
  :data:`SUMMARY_MIN_CONTEXT` --, one line per row, failures with their reasons, the peers' cache
  and whether they decoded writescope's tokens) and per model ``throughput-<model>.png``
  (decode tokens/s against context length, one line per policy, one panel per batch size) and
  ``cpu-share-<model>.png`` (the CPU's share of attended KV bytes over the decode steps, per
  policy, at the longest context that ran; a policy that failed there is named in the legend). Context axes are ticked at the grid's
  contexts; a panel whose rows failed says so in its title.
"""
from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SUMMARY_MIN_CONTEXT = 8192
BASE = "writescope"


def _ok(row: dict) -> bool:
    return not row.get("error") and bool(row.get("decode_tokens_per_s"))


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def experts_placement(row: dict[str, Any]) -> str | None:
    """Where a row's routed experts ran: ``"cpu"``, ``"gpu"``, or None when the row does not
    say (failed rows; results written before rows carried ``experts``)."""
    if row.get("experts") in ("cpu", "gpu"):
        return row["experts"]
    ex = row.get("cpu_expert_bytes_per_step")
    return None if ex is None else ("cpu" if ex > 0 else "gpu")


def group_label(rows: list[dict[str, Any]]) -> "dict[int, str]":
    """Per row (by ``id``), the group its model's figures are summed up in: the model's name, or
    ``"<model>, experts on CPU|GPU"`` when the rows (e.g. several runs merged by ``--report``)
    hold the model with its experts in both places -- issue 6's targets differ between the two,
    and rows of the same batch and context must not stand in for each other."""
    places: dict[str, set] = defaultdict(set)
    for r in rows:
        pl = experts_placement(r)
        if pl is not None:
            places[r["model"]].add(pl)
    out = {}
    for r in rows:
        pl = experts_placement(r)
        mixed = len(places[r["model"]]) > 1
        out[id(r)] = (f"{r['model']}, experts on {pl.upper()}" if mixed and pl is not None
                      else r["model"])
    return out


def same_work(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows of one (batch, context) did the same work: the same blocks in every
    region, no KV attended by the CPU at any step, nothing moved (e.g. every policy when nothing
    spills, or writescope at a CPU share of 0 beside transfer). Their times then differ by the
    machine alone -- with experts on the CPU, by its DRAM bandwidth at the time each ran
    (2026-12-01c-h200: up to 2.2x) -- and a ratio between them says nothing about the policies."""
    if not a.get("blocks") or a.get("blocks") != b.get("blocks"):
        return False
    return all(not any(r.get("cpu_share_steps") or [0.0]) and not r.get("bytes_moved")
               and not r.get("peer") for r in (a, b))


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _cells(rows: list[dict[str, Any]]) -> "dict[str, dict[tuple, dict[int, dict[str, dict]]]]":
    """Rows as ``group -> (batch, context) -> round -> policy -> row`` (a row without a round,
    a peer's or one of a run before ``--rounds``, is round 0)."""
    label = group_label(rows)
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        out[label[id(r)]][(r["batch"], r["context"])][r.get("round") or 0][r["policy"]] = r
    return out


def _tps(row: dict) -> float:
    return row["decode_tokens_per_s"]


def summarize(rows: list[dict[str, Any]], min_context: int = SUMMARY_MIN_CONTEXT) -> dict[str, Any]:
    """The summary. With several rounds (``--rounds``), writescope is compared with the other
    rows of its own round (run next to it) and a pair's ratio is the median over its rounds."""
    out: dict[str, Any] = {}
    for model, cells in _cells(rows).items():
        names = sorted({p for c in cells.values() for rd in c.values() for p in rd} - {BASE})
        peers = {p for c in cells.values() for rd in c.values() for p, r in rd.items()
                 if r.get("peer")}
        speedups: dict[str, Any] = {}
        for other in names:
            ratios, same_pairs = [], 0
            for (b, n), cell in sorted(cells.items()):
                if n < min_context:
                    continue
                paired = [(_tps(c[BASE]) / _tps(c[other]), same_work(c[BASE], c[other]))
                          for c in cell.values()
                          if BASE in c and other in c and _ok(c[BASE]) and _ok(c[other])]
                # a pair that did the same work is the machine's noise, not a speedup (Qwen3
                # 4 x 8K, nothing spilled: "2.2x cpu", 2026-12-01c-h200): left out, and counted
                differ = [x for x, same in paired if not same]
                if differ:
                    ratios.append(median(differ))
                elif paired:
                    same_pairs += 1
            speedups[other] = {"geomean_speedup": geomean(ratios), "pairs": len(ratios),
                               "same_work_pairs": same_pairs,
                               "min": min(ratios) if ratios else math.nan,
                               "max": max(ratios) if ratios else math.nan, "peer": other in peers}
        vs_best, eff, same, bound = [], [], [], []
        for (b, n), cell in sorted(cells.items()):
            by_round, effs, first_ws = [], [], None
            for rnd, c in sorted(cell.items()):
                ws = c.get(BASE)
                if ws is None or not _ok(ws):
                    continue
                first_ws = first_ws or ws
                if ws.get("bound_efficiency"):
                    effs.append(ws["bound_efficiency"])
                # the target compares policies that chose differently; rows that did
                # writescope's own work measure the machine's noise, reported beside it
                differ = []
                for p, r in c.items():
                    if p == BASE or p in peers or not _ok(r):
                        continue
                    if same_work(ws, r):
                        same.append(_tps(ws) / _tps(r))
                    else:
                        differ.append(_tps(r))
                if differ:
                    by_round.append(_tps(ws) / max(differ))
            if effs:
                eff.append(median(effs))
            if not by_round:
                continue
            d = {"batch": b, "context": n, "ratio": median(by_round)}
            if len(by_round) > 1:
                d["rounds"] = by_round
            vs_best.append(d)
            # experts on the CPU: the pairs whose spilled KV per step exceeds the activated
            # experts' bytes per step (issue 6: writescope >= 1.4x the best other policy there)
            kv = first_ws.get("spilled_kv_bytes_per_step")
            ex = (first_ws.get("cpu_expert_bytes_measured")
                  or first_ws.get("cpu_expert_bytes_per_step"))
            if kv and ex and kv > ex:
                bound.append(d)
        worst = min(vs_best, key=lambda d: d["ratio"]) if vs_best else None
        out[model] = {
            "kv_over_experts": {"pairs": [(d["batch"], d["context"]) for d in bound],
                                "geomean_vs_best_other_policy":
                                    geomean([d["ratio"] for d in bound])},
            "min_context": min_context, "speedup_over": speedups,
            "vs_best_other_policy": {
                "worst": worst, "pairs": len(vs_best),
                "pairs_more_than_3pct_slower": sum(d["ratio"] < 0.97 for d in vs_best),
                "by_round": [d for d in vs_best if "rounds" in d]},
            "same_work": {"rows": len(same), "min": min(same) if same else math.nan,
                          "max": max(same) if same else math.nan},
            "roofline_efficiency": {"geomean": geomean(eff), "min": min(eff) if eff else math.nan,
                                    "pairs": len(eff),
                                    "pairs_below_0.85": sum(e < 0.85 for e in eff)},
        }
    return out


# ------------------------------------------------------------------------------ formatting
def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(name)).name or str(name)).strip("-") or "model"


def _ctx(n: int) -> str:
    from ..units import format_count
    return format_count(int(n))


def _gib(x) -> str:
    return "" if x is None else f"{x / 2**30:.2f}"


def _bytes(x) -> str:
    from ..units import format_bytes
    return "" if x is None else format_bytes(int(x))


def _ms(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x * 1e3:.4g}"


def _read(x) -> str:
    """The read probe before and after a row's decode steps."""
    if not x or any(v is None for v in x):
        return ""
    return "-".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in x)


def _num(x, fmt="{:.2f}") -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def markdown(doc: dict[str, Any]) -> str:
    meta = doc.get("meta", {})
    git = meta.get("git", {})
    mach = meta.get("machine", {})
    lines = ["# writescope bench", "",
             f"- command: `{meta.get('command', '')}`",
             f"- git: `{git.get('commit')}`" + (" (uncommitted changes)" if git.get("dirty") else "")
             + (f", source digest `{git['source_digest']}`" if git.get("source_digest") else ""),
             f"- machine: {mach.get('cpu', '?')}, {mach.get('logical_cpus', '?')} CPUs"
             + (f", {mach['gpu']}" if mach.get("gpu") else ", no GPU")
             + f"; torch {meta.get('torch', '?')}",
             f"- when: {meta.get('timestamp', '')}", ""]
    if (meta.get("spec") or {}).get("prefill") == "synthetic":
        lines[-1:-1] = ["- prefill: **synthetic** (random KV written to the homes each policy chose, "
                        "no model prefill: decode rows only, no time to first token)"]
    spread = (meta.get("spec") or {}).get("length_spread") or 0
    if spread:
        lines[-1:-1] = [f"- prompt lengths: prompt i of a batch of B is {spread} * i / B tokens "
                        "shorter than the row's context (`--length-spread`)"]
    for model, m in doc.get("models", {}).items():
        lines.append(f"- **{model}**: static share {m.get('static_share', float('nan')):.3f} "
                     f"({m.get('static_share_from', '')}); KV blocks {m.get('kv_capacity_blocks')} "
                     f"of {m.get('block_size')} tokens; routed experts on the CPU in "
                     f"{m.get('experts_on_cpu_layers')} layers; VRAM budget {_gib(m.get('vram_budget'))} GiB")
    lines.append("")
    summ = doc.get("summary", {})
    if summ:
        lines += ["## Summary", "",
                  f"Geometric-mean decode-throughput speedup of `writescope` over each other "
                  f"policy and peer, contexts >= {_ctx(SUMMARY_MIN_CONTEXT)}, over the pairs "
                  f"where the two did different work (same-work pairs: the machine's noise, "
                  f"counted apart).", "",
                  "| model | over | geomean speedup | pairs | min | max | same-work pairs |",
                  "|---|---|---|---|---|---|---|"]
        for model, s in summ.items():
            for other, v in s["speedup_over"].items():
                lines.append(f"| {model} | {other}{' (peer)' if v['peer'] else ''} | "
                             f"{_num(v['geomean_speedup'], '{:.3f}')} | {v['pairs']} | "
                             f"{_num(v['min'], '{:.3f}')} | {_num(v['max'], '{:.3f}')} | "
                             f"{v.get('same_work_pairs', 0)} |")
        label = group_label(doc.get("rows", []))
        for model, s in summ.items():
            if any(v["pairs"] or v.get("same_work_pairs") for v in s["speedup_over"].values()):
                continue
            ran = [r["context"] for r in doc.get("rows", []) if label[id(r)] == model and _ok(r)]
            lines.append(f"\n**{model}**: no geomean speedup -- no context >= "
                         f"{_ctx(SUMMARY_MIN_CONTEXT)} where writescope and another policy or "
                         "peer both ran (the longest context that ran: "
                         + (_ctx(max(ran)) if ran else "none") + ").")
        lines += ["", "| model | worst writescope / best other policy | pairs > 3% slower | "
                      "roofline efficiency (geomean, min) | pairs < 0.85 | "
                      "same-work rows: writescope / other (noise) |", "|---|---|---|---|---|---|"]
        for model, s in summ.items():
            w = s["vs_best_other_policy"]["worst"]
            e = s["roofline_efficiency"]
            sw = s.get("same_work") or {"rows": 0}
            lines.append(f"| {model} | "
                         + (f"{w['ratio']:.3f} (b{w['batch']}, {_ctx(w['context'])})" if w else "")
                         + f" | {s['vs_best_other_policy']['pairs_more_than_3pct_slower']} of "
                           f"{s['vs_best_other_policy']['pairs']} | "
                         + (f"{_num(e['geomean'], '{:.3f}')}, {_num(e['min'], '{:.3f}')}"
                            if e["pairs"] else "") + " | "
                         f"{e['pairs_below_0.85']} of {e['pairs']} | "
                         + (f"{sw['min']:.3f}-{sw['max']:.3f} ({sw['rows']} rows)" if sw["rows"]
                            else "") + " |")
        lines.append("")
        lines.append("The worst-ratio column compares writescope with the policies that placed "
                     "KV differently; rows that did the same work as writescope's (same blocks "
                     "per region, no CPU attention, nothing moved) differ by the machine alone "
                     "and are in the last column.")
        for model, s in summ.items():
            for d in s["vs_best_other_policy"].get("by_round") or []:
                lines.append(f"- **{model}** b{d['batch']} x {_ctx(d['context'])}: writescope / "
                             f"best other policy by round "
                             + ", ".join(f"{x:.3f}" for x in d["rounds"])
                             + f" (median {d['ratio']:.3f})")
            k = s.get("kv_over_experts") or {}
            if k.get("pairs"):
                cells = ", ".join(f"b{b} x {_ctx(n)}" for b, n in k["pairs"])
                lines.append(f"- **{model}**, experts on the CPU: spilled KV per step exceeds the "
                             f"activated experts' bytes at {cells}; writescope / best other "
                             f"policy there: {_num(k['geomean_vs_best_other_policy'], '{:.3f}')} "
                             f"(geomean)")
        lines.append("")
    lines += ["## Rows", "",
              "Step times per decode step: measured (mean, p50, p99), the roofline model's for "
              "the row's policy and CPU share (model ms), the planner's own prediction while it "
              "ran (planner ms; writescope only), and the roofline bound over every share "
              "(bound ms).", "",
              "| model | batch | context | policy | tok/s | mean ms | p50 ms | p99 ms | TTFT s | "
              "peak VRAM | pinned used | host used | moved | CPU share | model ms | planner ms | "
              "bound ms | CPU experts ms | CPU read GB/s | host-bound | split steps | error |",
              "|" + "---|" * 22]
    rounds = _several_rounds(doc.get("rows", []))
    for r in doc.get("rows", []):
        moved = r.get("bytes_moved")
        policy = _policy_label(r, rounds)
        lines.append(
            f"| {r['model']} | {r['batch']} | {_ctx(r['context'])} | {policy} | "
            f"{_num(r.get('decode_tokens_per_s'), '{:.1f}')} | {_ms(r.get('mean_step_s'))} | "
            f"{_ms(r.get('p50_step_s'))} | {_ms(r.get('p99_step_s'))} | "
            f"{_num(r.get('ttft_s'), '{:.3f}')} | {_bytes(r.get('peak_vram_bytes'))} | "
            f"{_bytes(r.get('pinned_used_bytes'))} | {_bytes(r.get('host_used_bytes'))} | "
            f"{_bytes(moved)} | "
            f"{_num(r.get('cpu_share_mean'), '{:.2f}')} | {_ms(r.get('model_step_s'))} | "
            f"{_ms(r.get('planner_predicted_step_s'))} | {_ms(r.get('roofline_bound_s'))} | "
            f"{_ms(r.get('cpu_expert_s_mean'))} | "
            f"{_read(r.get('cpu_read_gbps'))} | "
            f"{_num(r.get('host_bound_fraction'), '{:.2f}')} | {_split_steps(r)} | "
            f"{(r.get('error') or '').replace('|', '/')} |")
    lines.append("")
    jit = [r for r in doc.get("rows", []) if r.get("jit_compiles")]
    if jit:  # a timed step that compiled a kernel stalled for it (bench/jit_log.py)
        lines += ["Rows whose timed decode steps compiled Triton kernels (each such step includes "
                  "the compile):", ""]
        for r in jit:
            kernels = sorted({c["kernel"].split("[")[0] for c in r["jit_compiles"]})
            steps = sorted({c["step"] for c in r["jit_compiles"]})
            lines.append(f"- {r['model']} b{r['batch']} {_ctx(r['context'])} "
                         f"{_policy_label(r, rounds)}: {len(r['jit_compiles'])} at steps "
                         f"{', '.join(map(str, steps))} ({', '.join(kernels)})")
        lines.append("")
    lines += planner_table(doc.get("rows", []))
    lines += peers_lines(doc.get("rows", []))
    div = [(r, d) for r in doc.get("rows", []) if r.get("peer")
           for d in (r.get("first_divergence") or []) if d]
    if div:
        lines += ["Where a peer's greedy tokens first leave writescope's (same prefix up to there; "
                  "the gap is the peer's preference for its own token, in nats of its own "
                  "log-probabilities):", ""]
        for r, d in div:
            lines.append(f"- {r['model']} b{r['batch']} {_ctx(r['context'])} {r['policy']}: "
                         f"step {d['step']}, gap {d['gap_nats']:.4f} nats, writescope's token "
                         f"ranked {d['writescope_token_rank'] + 1} by the peer (its top-2 margin "
                         f"{d['peer_top2_margin_nats']:.4f})")
        lines.append("")
    return "\n".join(lines)


def peers_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: per model and peer, the cache and weights placement it ran with, its note
    (e.g. transformers' offloaded cache fell back to the dynamic one off CUDA), and how many of
    its sequences decoded writescope's greedy tokens; nothing without peer rows."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("peer"):
            groups[(r["model"], r["policy"])].append(r)
    if not groups:
        return []
    out = ["## Peers", ""]
    for (model, peer), rs in groups.items():
        facts = [f"{k} {v}" for k, v in (("cache", rs[0].get("peer_cache")),
                                          ("weights", rs[0].get("peer_weights"))) if v]
        notes = list(dict.fromkeys(r["note"] for r in rs if r.get("note")))
        checked = [r for r in rs if r.get("same_tokens_as_writescope") is not None]
        same = sum(round(r["same_tokens_as_writescope"] * r["batch"]) for r in checked)
        out.append(f"- **{model}** {peer}: " + (", ".join(facts) or "no run")
                   + "".join(f" ({n})" for n in notes)
                   + (f"; writescope's greedy tokens in {same} of "
                      f"{sum(r['batch'] for r in checked)} sequences" if checked else ""))
    return out + [""]


def _split_steps(r: dict[str, Any]) -> str:
    """The timed decode steps that ran as two interleaved sub-batches, of all of them
    (``engine/graphs.pipelined_pieces``: CPU experts or attention overlapping the other
    sub-batch's GPU work); empty for a row without timed steps."""
    steps = r.get("step_times_s") or []
    if not steps or r.get("pipelined_steps") is None:
        return ""
    return f"{int(r['pipelined_steps'])} of {len(steps)}"


def _several_rounds(rows: list[dict[str, Any]]) -> bool:
    return len({r.get("round") or 0 for r in rows}) > 1


def _policy_label(r: dict[str, Any], several_rounds: bool) -> str:
    """A row's policy, with its round when the run had several (a peer runs once)."""
    if several_rounds and not r.get("peer") and r.get("round") is not None:
        return f"{r['policy']} (round {r['round'] + 1})"
    return r["policy"]


def planner_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: for rows whose planner reported its state (``writescope``), the target
    share and the rate corrections once the prefill had placed the blocks and after the decode
    steps, and the link's measured rate; nothing when no row has them."""
    have = [r for r in rows if (r.get("planner_at_prefill") or {}).get("target_share") is not None]
    if not have:
        return []

    def st(d: dict | None) -> str:
        d = d or {}
        return (f"{_num(d.get('target_share'))} | {_num(d.get('cpu_rate_correction'))} | "
                f"{_num(d.get('pcie_rate_correction'))} | {_num(d.get('gpu_rate_correction'))}")

    out = ["## Planner", "",
           "The planner when the prefill had placed the blocks and after the decode steps "
           "(target share of the spilled KV; rate corrections, measured / profile time):", "",
           "| model | batch | context | policy | target, prefill | CPU | link | GPU | "
           "target, after | CPU | link | GPU | link GB/s |", "|" + "---|" * 13]
    rounds = _several_rounds(rows)
    for r in have:
        out.append(f"| {r['model']} | {r['batch']} | {_ctx(r['context'])} | "
                   f"{_policy_label(r, rounds)} | "
                   f"{st(r.get('planner_at_prefill'))} | {st(r.get('planner_after'))} | "
                   f"{_num(r.get('pcie_gbps'), '{:.1f}')} |")
    return out + [""]


def plot(doc: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = doc.get("rows", [])
    written = []
    label = group_label(rows)
    models = list(dict.fromkeys(label[id(r)] for r in rows))
    for model in models:
        mrows = [r for r in rows if label[id(r)] == model]
        batches = sorted({r["batch"] for r in mrows})
        policies = list(dict.fromkeys(r["policy"] for r in mrows))
        # ---- decode throughput against context length
        fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
        for ax, b in zip(axes[0], batches):
            brows = [r for r in mrows if r["batch"] == b]
            failed = sum(not _ok(r) for r in brows)
            for p in policies:
                by_ctx = defaultdict(list)  # several rounds: their median
                for r in mrows:
                    if r["batch"] == b and r["policy"] == p and _ok(r):
                        by_ctx[r["context"]].append(r["decode_tokens_per_s"])
                pts = sorted((n, median(v)) for n, v in by_ctx.items())
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p,
                            linestyle="--" if any(r.get("peer") for r in mrows if r["policy"] == p) else "-")
            ax.set_xscale("log", base=2)
            # ticked at the grid's contexts (those that failed too), labelled as the rows are
            contexts = sorted({r["context"] for r in brows})
            ax.set_xticks(contexts, [_ctx(n) for n in contexts])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            if len(contexts) == 1:
                ax.set_xlim(contexts[0] / 2, contexts[0] * 2)
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel("decode tokens/s")
            # from zero: rows that do the same work differ by a few per cent, and an axis
            # fitted to them draws that noise as large gaps between the policies
            # (and above the fastest point by a margin: its marker is not cut by the frame)
            top = max((y for ln in ax.lines for y in ln.get_ydata()), default=0.0)
            ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.08 * top))
            ax.set_title(f"{model}, batch {b}"
                         + ("" if not failed else
                            f": no row ran ({failed} failed)" if not ax.lines else
                            f" ({failed} row{'s' if failed > 1 else ''} failed: results.md)"))
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"throughput-{_slug(model)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
        # ---- CPU share over decode steps, at the longest context that ran
        fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
        for ax, b in zip(axes[0], batches):
            ran = [r for r in mrows if r["batch"] == b and _ok(r) and r.get("cpu_share_steps")
                   and not r.get("round")]  # (the first round's)
            if ran:
                n = max(r["context"] for r in ran)
                # policies that placed KV alike draw the same line: each its own hollow marker,
                # the earlier ones larger, so that every policy stays in sight
                for i, r in enumerate(r for r in ran if r["context"] == n):
                    ax.plot(range(1, len(r["cpu_share_steps"]) + 1), r["cpu_share_steps"],
                            label=r["policy"], marker="osD^vPX*"[i % 8], fillstyle="none",
                            markersize=max(3.0, 10 - 1.5 * i))
                for r in mrows:  # a policy that failed here is named, not silently absent
                    if (r["batch"] == b and r["context"] == n and not r.get("peer")
                            and not r.get("round") and not _ok(r)):
                        ax.plot([], [], " ", label=f"{r['policy']}: failed")
                ax.set_title(f"{model}, batch {b}, context {_ctx(n)}")
            else:
                ax.set_title(f"{model}, batch {b}: no run")
            ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("decode step")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_ylabel("CPU share of attended KV")
            ax.grid(True, alpha=0.3)
            if ran:
                ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"cpu-share-{_slug(model)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(doc: dict[str, Any], out: str | Path) -> dict[str, Any]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "results.md"
    md.write_text(markdown(doc))
    pngs = plot(doc, out)
    return {"markdown": md, "plots": pngs}
