"""The GPU attention bench's markdown: the summary table against the run's ceilings and the
hybrid rows' breakdown (``python -m writescope.bench.gpu_attention --breakdown FILE``)."""
from __future__ import annotations


def hybrid_rows(r: dict) -> list[tuple[str, dict, str]]:
    """A result's hybrid rows as (share, row, form), share by share, the single form first."""
    single, piped = r.get("hybrid") or {}, r.get("hybrid_pipelined") or {}
    return [(x, d[x], form) for x in sorted(set(single) | set(piped), key=float)
            for form, d in (("single", single), ("pipelined", piped)) if x in d]


def summary_markdown(out: dict) -> str:
    c = out["ceilings"]
    hbm, h2d, comb = c["hbm_copy_GBps"], c["h2d_pinned_GBps"], c["combined"]["combined_GBps"]
    lines = [f"Ceilings (same run): HBM copy {hbm:.0f} GB/s (read+write); pinned H2D "
             f"{h2d:.1f} GB/s; H2D + CPU read together {c['combined']['h2d_GBps']:.1f} + "
             f"{c['combined']['cpu_read_GBps']:.1f} = {comb:.1f} GB/s "
             f"({c['combined']['threads']} threads). CPU kernel: {out['machine']['cpu_kernel']}.",
             "",
             "| shape/batch | resident GB/s: default (% HBM) / default from a CUDA graph (% HBM) "
             "/ best / default's kernels alone "
             "| streamed GB/s (% H2D) | hybrid best GB/s (share) | % combined | x streamed-only "
             "| CPU-only GB/s |",
             "|---|---|---|---|---|---|---|"]
    for key, r in out["results"].items():
        res = r.get("resident")
        if res:
            d = res.get("default_GBps") or 0.0
            dg = res.get("default_graph_GBps")  # the engine's form: replayed from a CUDA graph
            dd = res.get("default_device_GBps")
            rs = (f"{d:.0f} ({100 * d / hbm:.0f}%) / "
                  + (f"{dg:.0f} ({100 * dg / hbm:.0f}%)" if dg else "-")
                  + f" / {res['GBps']:.0f} / "
                  + (f"{dd:.0f} ({100 * dd / hbm:.0f}%)" if dd else "-"))
        else:
            rs = "-"
        st = r.get("streamed")
        if st:
            sbest = max(v["GBps"] for v in st.values())
            ss = f"{sbest:.1f} ({100 * sbest / h2d:.0f}%)"
        else:
            sbest, ss = None, "-"
        hy = r.get("hybrid") or r.get("hybrid_pipelined")
        if hy:
            x, v, form = max(hybrid_rows(r), key=lambda t: t[1]["GBps"])
            base = hy.get("0.00", {}).get("GBps")
            cpu_only = hy.get("1.00", {}).get("GBps")
            hs = f"{v['GBps']:.1f} ({x}{', pipelined' if form == 'pipelined' else ''})"
            pc = f"{100 * v['GBps'] / comb:.0f}%"
            xs = f"{v['GBps'] / base:.2f}x" if base else "-"
            co = f"{cpu_only:.1f}" if cpu_only else "-"
        else:
            hs = pc = xs = co = "-"
        lines.append(f"| {key} | {rs} | {ss} | {hs} | {pc} | {xs} | {co} |")
    return "\n".join(lines)


def breakdown_markdown(out: dict) -> str:
    """Where each hybrid row's time went, share by share: the step's GB/s (% of the combined
    ceiling), the link's rate over its copies (T bytes / first to last copy on the device), the
    CPU kernel's rate (C bytes / its seconds after the queries landed), the CPU's wait for the
    layers' queries, the first copy's start after the step's, and the device's time after the
    last copy (the merge alone where the link was the longer side; more where the CPU was). The
    row's timings are those of its median timed step (on CUDA a step with device events, whose
    wall time is the last column; the GB/s and the step ms are of the steps without them, see
    :func:`_run_steps`). A side with nothing to do has '-'. A row of the pipelined form has its
    sub-batches after the share (``0.60 p4+4``)."""
    comb = out["ceilings"]["combined"]["combined_GBps"]
    lines = ["| shape/batch | share | GB/s (% combined) | link GB/s | CPU GB/s | CPU wait for "
             "queries ms | first copy ms | after last copy ms | step ms | timed step ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    for key, r in out["results"].items():
        total = r.get("bytes_per_step")
        for share, h, form in hybrid_rows(r):
            if form == "pipelined":
                share = f"{share} p{'+'.join(str(g) for g in r.get('groups', []))}"
            link_b = h.get("pcie_bytes") or 0.0
            f0, f1, end = h.get("dev_first_copy_s"), h.get("dev_last_copy_s"), h.get("dev_end_s")
            link = (link_b / (f1 - f0) / 1e9 if link_b and f0 is not None and f1 is not None
                    and f1 > f0 else None)
            cs = h.get("cpu_s")
            cpu = (total - link_b) / cs / 1e9 if total and cs else None
            tail = (end - f1) * 1e3 if link_b and end is not None and f1 is not None else None
            first = f0 * 1e3 if link_b and f0 is not None else None
            qw = h.get("cpu_q_wait_s")
            lines.append(
                f"| {key} | {share} | {h['GBps']:.1f} ({100 * h['GBps'] / comb:.0f}%) | "
                f"{fmt(link, '.1f')} | {fmt(cpu, '.1f')} | "
                f"{fmt(qw * 1e3 if cs and qw is not None else None, '.2f')} | "
                f"{fmt(first, '.2f')} | {fmt(tail, '.2f')} | {h['s'] * 1e3:.2f} | "
                f"{fmt(ts * 1e3 if (ts := h.get('timed_step_s')) is not None else None, '.2f')} |")
    return "\n".join(lines)
