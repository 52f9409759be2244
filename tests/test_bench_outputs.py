"""What ``writescope bench`` writes, as a user reads it: the summary when no context reaches the
summary's threshold, the peers' facts in results.md, the plots' axes when rows failed or one
context ran, and the console lines beside the progress bar."""
from __future__ import annotations

from pathlib import Path

import pytest

from writescope.bench.report import markdown, plot, summarize


def _row(policy, b, n, tps=None, error=None, peer=False, **kw):
    r = {"model": "m", "batch": b, "context": n, "policy": policy, "peer": peer, **kw}
    if tps is not None:
        r["decode_tokens_per_s"] = tps
    if error:
        r["error"] = error
    return r


def test_summary_says_when_no_context_reaches_8k():
    """A grid of 256 and 1k contexts has no pair for the geomean: the report says why instead of
    a table of blank cells."""
    rows = [_row("writescope", 1, 256, 90.0), _row("transfer", 1, 256, 80.0),
            _row("writescope", 1, 1024, 85.0), _row("transfer", 1, 1024, 70.0),
            _row("transfer", 1, 8192, error="over the KV budget")]
    md = markdown({"rows": rows, "summary": summarize(rows)})
    summary = md.split("## Rows")[0]
    assert "no geomean speedup" in summary and "1k" in summary
    # no writescope row with a roofline bound: an empty cell, not a stray comma
    assert "| ,  |" not in summary
    # with a pair at >= 8K there is no such line
    rows += [_row("writescope", 1, 8192, 50.0), _row("transfer", 1, 16384, 40.0),
             _row("writescope", 1, 16384, 60.0)]
    assert "no geomean speedup" not in markdown({"rows": rows, "summary": summarize(rows)})


def test_markdown_says_which_cache_the_peer_ran_with_and_whether_its_tokens_matched():
    note = "transformers' offloaded cache needs CUDA: ran with the dynamic cache"
    rows = [_row("writescope", 1, 256, 90.0),
            _row("transformers", 1, 256, 150.0, peer=True, peer_cache="dynamic",
                 peer_weights="device", note=note, same_tokens_as_writescope=1.0),
            _row("transformers", 2, 256, 150.0, peer=True, peer_cache="dynamic",
                 peer_weights="device", note=note, same_tokens_as_writescope=0.5)]
    md = markdown({"rows": rows, "summary": summarize(rows)})
    assert note in md
    assert "dynamic" in md.split("## Rows")[1]
    assert "2 of 3 sequences" in md  # 1 of 1 at batch 1, 1 of 2 at batch 2


def _axes(monkeypatch):
    import matplotlib.figure
    got = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig, path, *a, **k):
        fig.canvas.draw()
        got[Path(path).name] = [
            {"title": ax.get_title(),
             "xticks": [t.get_text() for t in ax.get_xticklabels()],
             "xticks_at": list(ax.get_xticks()), "xlim": ax.get_xlim(), "ylim": ax.get_ylim(),
             "markers": [ln.get_marker() for ln in ax.lines],
             "legend": [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend()
             else []} for ax in fig.axes]
        return save(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return got


def _shown(ax):
    """The tick labels inside the axis' limits."""
    return [t for t, x in zip(ax["xticks"], ax["xticks_at"]) if ax["xlim"][0] <= x <= ax["xlim"][1]]


def test_throughput_axes_tick_the_grids_contexts_and_say_when_no_row_ran(tmp_path, monkeypatch):
    got = _axes(monkeypatch)
    rows = [_row("writescope", 1, 256, 90.0), _row("transfer", 1, 256, 80.0),
            _row("writescope", 1, 1024, 85.0), _row("transfer", 1, 1024, error="over the budget"),
            _row("writescope", 2, 1024, error="over the budget"),
            _row("transfer", 2, 1024, error="over the budget")]
    plot({"rows": rows}, tmp_path)
    b1, b2 = got["throughput-m.png"]
    shown = _shown(b1)
    assert shown == ["256", "1k"]               # the contexts, not 2^8 and 2^10
    assert "1 row failed" in b1["title"]
    assert "no row ran" in b2["title"] and "2 failed" in b2["title"]
    shown = _shown(b2)
    assert shown == ["1k"]                      # the context that failed, not 2^0..2^3


def test_cpu_share_plot_steps_lines_and_failed_policies(tmp_path, monkeypatch):
    """Whole decode steps on the axis; policies whose lines coincide each keep a marker of their
    own; a policy that failed at the plotted context is in the legend as failed."""
    got = _axes(monkeypatch)
    rows = [_row("writescope", 1, 1024, 85.0, cpu_share_steps=[0.5, 0.5, 0.5, 0.5]),
            _row("cpu", 1, 1024, 80.0, cpu_share_steps=[0.5, 0.5, 0.5, 0.5]),
            _row("transfer", 1, 1024, error="over the pinned budget")]
    plot({"rows": rows}, tmp_path)
    (ax,) = got["cpu-share-m.png"]
    shown = _shown(ax)
    assert shown and all("." not in t for t in shown)  # no step 1.5
    assert ax["markers"][:2] == ["o", "s"]
    assert ax["legend"] == ["writescope", "cpu", "transfer: failed"]


def test_log_lines_do_not_land_on_the_progress_bars_line(tmp_path, monkeypatch, capsys):
    """A row's failure printed while the bar is drawn goes on a line of its own (tqdm.write),
    and the bar's postfix names the row just counted, not the one before it."""
    from writescope.bench import grid as grid_mod
    from tqdm import tqdm
    spec = grid_mod.GridSpec(models=["m"], batches=[1], context_lengths=[256],
                             policies=["writescope"], out=str(tmp_path))
    g = grid_mod.Grid(spec, progress=True)
    writes = []
    monkeypatch.setattr(tqdm, "write", classmethod(lambda cls, s, *a, **k: writes.append(s)))
    postfix = []

    class Bar:
        def update(self, n):
            postfix.append(("update", n))

        def set_postfix_str(self, s, refresh=True):
            postfix.append(("postfix", s))

    g._add(_row("writescope", 1, 256, error="over the KV budget"), Bar())
    assert any("over the KV budget" in w for w in writes)
    assert "over the KV budget" not in capsys.readouterr().err
    assert [k for k, _ in postfix] == ["postfix", "update"]


def test_no_ttft_for_synthetic_rows_in_the_console(tmp_path):
    from writescope.bench import grid as grid_mod
    spec = grid_mod.GridSpec(models=["m"], batches=[1], context_lengths=[256],
                             policies=["writescope"], out=str(tmp_path))
    lines = []
    g = grid_mod.Grid(spec, log=lines.append, progress=False)
    g._add(_row("writescope", 1, 256, 90.0, ttft_s=None, p50_step_s=0.01, cpu_share_mean=0.0),
           None)
    assert lines and "TTFT 0.0" not in lines[-1]


def test_the_fastest_point_is_not_cut_by_the_frame(tmp_path, monkeypatch):
    got = _axes(monkeypatch)
    rows = [_row("writescope", 1, 512, 81.1), _row("writescope", 1, 1024, 53.7),
            _row("transfer", 1, 512, 45.9), _row("transfer", 1, 1024, 44.7)]
    plot({"rows": rows}, tmp_path)
    (ax,) = got["throughput-m.png"]
    assert ax["ylim"][0] == 0 and ax["ylim"][1] >= 1.05 * 81.1
