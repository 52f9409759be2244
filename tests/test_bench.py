"""``writescope bench``: the grid on a tiny checkpoint (all five policies and the transformers
peer), its files, failed rows, the summary arithmetic."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from writescope.attention.torch_paged import attend_torch
from writescope.bench.grid import GridSpec, parse_int_list, parse_name_list, run_grid
from writescope.bench.row import make_prompts
from writescope.bench.report import geomean, markdown, summarize

POLICIES = ("writescope", "transfer", "cpu", "static", "migrate")


def test_list_parsing():
    assert parse_int_list("1k,8k,32k,128k") == [1024, 8192, 32768, 131072]
    assert parse_int_list("1,4,16") == [1, 4, 16]
    assert parse_name_list(["a,b", "c"]) == ["a", "b", "c"]
    with pytest.raises(ValueError):
        parse_int_list("8KiB")
    with pytest.raises(ValueError):
        GridSpec(models=["m"], batches=[0], context_lengths=[8]).validate()
    with pytest.raises(ValueError):
        GridSpec(models=["m"], batches=[1], context_lengths=[8], peers=["vllm"]).validate()
    with pytest.raises(ValueError, match="static-ref-length"):
        GridSpec(models=["m"], batches=[1], context_lengths=[8], static_ref_length=0).validate()
    with pytest.raises(ValueError, match="rounds"):
        GridSpec(models=["m"], batches=[1], context_lengths=[8], rounds=0).validate()


def test_prompts_are_seeded_and_shared():
    a = make_prompts(320, 2, 50, seed=0)
    assert a == make_prompts(320, 2, 50, seed=0) and a != make_prompts(320, 2, 50, seed=1)
    assert len(a) == 2 and all(len(p) == 50 and all(3 <= t < 320 for t in p) for p in a)


def _row(policy, b, n, tps=None, error=None, peer=False, eff=None):
    r = {"model": "m", "batch": b, "context": n, "policy": policy, "peer": peer}
    if tps is not None:
        r["decode_tokens_per_s"] = tps
    if error:
        r["error"] = error
    if eff is not None:
        r["bound_efficiency"] = eff
    return r


def test_summary_geomean_over_long_contexts_only():
    rows = [_row("writescope", 1, 1024, 100, eff=0.5), _row("transfer", 1, 1024, 1),   # < 8K: out
            _row("writescope", 1, 8192, 100, eff=0.9), _row("transfer", 1, 8192, 50),
            _row("writescope", 4, 32768, 100, eff=0.8), _row("transfer", 4, 32768, 25),
            _row("cpu", 1, 8192, 104), _row("cpu", 4, 32768, error="out of memory"),
            _row("transformers", 1, 8192, 10, peer=True)]
    s = summarize(rows)["m"]
    assert s["speedup_over"]["transfer"]["pairs"] == 2
    assert s["speedup_over"]["transfer"]["geomean_speedup"] == pytest.approx(math.sqrt(2 * 4))
    assert s["speedup_over"]["cpu"]["pairs"] == 1          # the failed row is left out
    assert s["speedup_over"]["transformers"]["peer"] is True
    worst = s["vs_best_other_policy"]["worst"]            # the peer is not a policy
    assert worst["ratio"] == pytest.approx(100 / 104) and worst["context"] == 8192
    assert s["vs_best_other_policy"]["pairs_more_than_3pct_slower"] == 1
    assert s["roofline_efficiency"]["pairs_below_0.85"] == 2
    assert geomean([]) != geomean([])  # nan
    assert "| m | transfer | 2.828 | 2 | 2.000 | 4.000 | 0 |" in markdown({"rows": rows, "summary": summarize(rows)})


def test_rows_that_did_the_same_work_are_noise_not_a_policy_gap():
    """A policy that placed KV exactly as writescope did (same blocks per region, no CPU share,
    nothing moved) is left out of the worst ratio: the gap to it is the machine's (2026-12-01c-h200:
    Mixtral 2 x 128K at a CPU share of 0 ran 0.84x static, both all-T). It is reported apart."""
    same = {"G": 10, "T": 5, "C": 0, "W": 1}
    rows = [_row("writescope", 2, 131072, 80), _row("static", 2, 131072, 100),
            _row("transfer", 2, 131072, 90), _row("cpu", 2, 131072, 70)]
    for r in rows[:3]:
        r.update(blocks=dict(same), cpu_share_steps=[0.0, 0.0], bytes_moved=0)
    rows[3].update(blocks={"G": 10, "T": 0, "C": 5, "W": 1}, cpu_share_steps=[0.3, 0.3],
                   bytes_moved=0)
    s = summarize(rows)["m"]
    assert s["vs_best_other_policy"]["worst"]["ratio"] == pytest.approx(80 / 70)
    assert s["vs_best_other_policy"]["pairs_more_than_3pct_slower"] == 0
    # nor is a same-work pair a speedup (or a slowdown)
    assert s["speedup_over"]["static"]["pairs"] == 0
    assert s["speedup_over"]["static"]["same_work_pairs"] == 1
    assert s["speedup_over"]["cpu"]["pairs"] == 1 and s["speedup_over"]["cpu"]["same_work_pairs"] == 0
    assert s["same_work"] == {"rows": 2, "min": pytest.approx(0.8), "max": pytest.approx(80 / 90)}
    assert "| 0.800-0.889 (2 rows) |" in markdown({"rows": rows, "summary": summarize(rows)})
    # a different placement is compared, however small the difference
    rows[1]["blocks"] = {"G": 10, "T": 4, "C": 1, "W": 1}
    s = summarize(rows)["m"]
    assert s["vs_best_other_policy"]["worst"]["ratio"] == pytest.approx(0.8)
    assert s["same_work"]["rows"] == 1
    # so is a policy that moved bytes to get there (migrate), and any CPU share
    rows[1]["blocks"] = dict(same)
    rows[1]["bytes_moved"] = 1
    assert summarize(rows)["m"]["vs_best_other_policy"]["worst"]["ratio"] == pytest.approx(0.8)
    rows[1]["bytes_moved"] = 0
    rows[0]["cpu_share_steps"] = [0.0, 0.01]
    assert summarize(rows)["m"]["same_work"]["rows"] == 0


def test_rounds_pair_writescope_with_the_rows_of_its_own_round():
    """With --rounds, a ratio compares rows that ran next to each other: here the machine was
    twice as fast in round 2 for every policy, and writescope is 1.1x / 0.95x the others round
    by round. Unpaired (best row of any round against writescope's median), the ratios would
    mix the two machines' speeds."""
    rows = []
    for rnd, speed in ((0, 1.0), (1, 2.0), (2, 1.0)):
        ws = {0: 110, 1: 95, 2: 110}[rnd] * speed
        for pol, tps in (("writescope", ws), ("transfer", 100 * speed), ("cpu", 50 * speed)):
            r = _row(pol, 2, 32768, tps, eff=0.5 * speed)
            r["round"] = rnd
            rows.append(r)
    rows.append(_row("transformers", 2, 32768, 1, peer=True))  # a peer runs once (round 0)
    s = summarize(rows)["m"]
    v = s["vs_best_other_policy"]
    assert v["worst"]["ratio"] == pytest.approx(1.1)  # the median of 1.1, 0.95, 1.1
    assert v["worst"]["rounds"] == pytest.approx([1.1, 0.95, 1.1])
    assert v["pairs"] == 1 and v["by_round"] == [v["worst"]]
    assert s["speedup_over"]["transfer"]["geomean_speedup"] == pytest.approx(1.1)
    assert s["speedup_over"]["cpu"]["geomean_speedup"] == pytest.approx(2.2)
    assert s["speedup_over"]["transformers"]["geomean_speedup"] == pytest.approx(110)
    assert s["roofline_efficiency"]["geomean"] == pytest.approx(0.5)  # median of 0.5, 1.0, 0.5
    md = markdown({"rows": rows, "summary": summarize(rows)})
    assert "best other policy by round 1.100, 0.950, 1.100 (median 1.100)" in md
    assert "| writescope (round 2) |" in md and "| transformers |" in md
    assert (rows[3]["policy"], rows[3]["round"]) == ("writescope", 1)
    rows[3]["decode_tokens_per_s"] = 300  # round 2's writescope now 1.5x: the median holds
    assert summarize(rows)["m"]["vs_best_other_policy"]["worst"]["ratio"] == pytest.approx(1.1)


def test_summary_of_the_pairs_whose_spilled_kv_exceeds_the_cpu_experts_bytes():
    """Issue 6's experts-on-CPU target is over the (batch, context) pairs whose spilled KV per
    step exceeds the activated experts' bytes per step: the summary names them and takes the
    geomean of writescope over the best other policy there only."""
    rows = [_row("writescope", 4, 8192, 100), _row("transfer", 4, 8192, 100),
            _row("writescope", 4, 131072, 30), _row("transfer", 4, 131072, 20),
            _row("cpu", 4, 131072, 15)]
    for r in rows:
        big = r["context"] > 8192
        r["spilled_kv_bytes_per_step"] = 25e9 if big else 0.0
        r["cpu_expert_bytes_per_step"] = 13e9
    s = summarize(rows)["m"]
    assert s["kv_over_experts"]["pairs"] == [(4, 131072)]
    assert s["kv_over_experts"]["geomean_vs_best_other_policy"] == pytest.approx(1.5)
    text = markdown({"rows": rows, "summary": summarize(rows)})
    assert "spilled KV per step exceeds the activated experts' bytes at b4 x 128k" in text
    assert "compiled Triton kernels" not in text
    rows[0]["jit_compiles"] = [{"step": 3, "at_ms": 1.0, "kernel": "wait_kernel[num_warps=1](x)"},
                               {"step": 3, "at_ms": 2.0, "kernel": "partial_kernel[...](y)"}]
    text = markdown({"rows": rows, "summary": summarize(rows)})
    assert "- m b4 8k writescope: 2 at steps 3 (partial_kernel, wait_kernel)" in text
    for r in rows:  # experts on the GPU: no such pairs
        r["cpu_expert_bytes_per_step"] = 0.0
    assert summarize(rows)["m"]["kv_over_experts"]["pairs"] == []


def test_merged_runs_sum_up_a_model_per_experts_placement(tmp_path):
    """Runs merged by --report that hold a model with its experts on the GPU and on the CPU are
    summed up, tabled and plotted apart (issue 6's targets differ; the same batch and context
    must not stand in for each other); a model in one placement keeps its own name."""
    from writescope.bench.report import write_report
    gpu = [_row("writescope", 4, 32768, 80), _row("transfer", 4, 32768, 50)]
    cpu = [_row("writescope", 4, 32768, 12), _row("transfer", 4, 32768, 8),
           _row("transformers", 4, 32768, 1, peer=True)]
    for r in gpu:
        r["experts"] = "gpu"
    for r in cpu[:2]:
        r["cpu_expert_bytes_per_step"] = 13e9  # (older rows: no "experts" field)
    cpu[2]["experts"] = "cpu"
    s = summarize(gpu + cpu)
    assert set(s) == {"m, experts on GPU", "m, experts on CPU"}
    assert s["m, experts on GPU"]["speedup_over"]["transfer"]["geomean_speedup"] == pytest.approx(1.6)
    assert s["m, experts on CPU"]["speedup_over"]["transfer"]["geomean_speedup"] == pytest.approx(1.5)
    assert s["m, experts on CPU"]["speedup_over"]["transformers"]["geomean_speedup"] == 12
    assert set(summarize(cpu)) == {"m"}
    res = write_report({"rows": gpu + cpu, "summary": s}, tmp_path)
    assert sorted(p.name for p in res["plots"]) == [
        "cpu-share-m-experts-on-CPU.png", "cpu-share-m-experts-on-GPU.png",
        "throughput-m-experts-on-CPU.png", "throughput-m-experts-on-GPU.png"]


def test_unknown_model_gives_failed_rows_and_files(tmp_path):
    spec = GridSpec(models=["no-such-model"], batches=[1], context_lengths=[64, 128],
                    decode_steps=4, policies=["transfer", "migrate"], out=str(tmp_path), device="cpu")
    doc = run_grid(spec, progress=False, log=lambda m: None)
    assert len(doc["rows"]) == 4 and all("error" in r for r in doc["rows"])
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["error"]
    assert (tmp_path / "results.md").exists()


def bench_cli(model, out, *args, profile=None) -> int:
    """``writescope bench`` on the CPU in float32 on one thread (the timings stay steady on a
    2-core machine), with the migrate tests' synthetic profile unless ``profile`` is given."""
    import torch
    from test_migrate import synthetic_profile
    from writescope.cli import main

    prof = out / "profile.json"
    (profile or synthetic_profile()).save(prof)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(["bench", "--model", str(model), "--dtype", "float32", "--device", "cpu",
                     "--block-size", "8", "--profile", str(prof), "--out", str(out),
                     "--no-progress", *args])
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def grid(tiny_qwen3_moe, tmp_path_factory):
    """The CLI on the tiny Qwen3-MoE: 5 policies + the transformers peer, batches 1 and 2,
    contexts 40 and 72 (G holds 32 tokens, so both spill) and 3000 (beyond the checkpoint's
    max_position_embeddings of 2048: every policy's row there fails, the run goes on)."""
    out = tmp_path_factory.mktemp("bench")
    rc = bench_cli(tiny_qwen3_moe, out, "--batch", "1,2", "--context-lengths", "40,72,3000",
                   "--decode-steps", "8", "--num-gpu-blocks", "4", "--policies", ",".join(POLICIES),
                   "--peer", "transformers", "--max-num-batched-tokens", "256")
    assert rc == 0
    return out


def _strict_json(path):
    def no_nan(x):
        raise ValueError(f"non-standard JSON constant {x}")
    return json.loads(path.read_text(), parse_constant=no_nan)


def test_grid_writes_json_markdown_and_plots(grid):
    doc = _strict_json(grid / "results.json")
    meta = doc["meta"]
    assert meta["command"] and meta["spec"]["decode_steps"] == 8
    assert "commit" in meta["git"] and meta["machine"]["cpu"] and meta["timestamp"]
    rows = doc["rows"]
    assert len(rows) == 2 * 3 * (len(POLICIES) + 1)
    md = (grid / "results.md").read_text()
    assert "## Summary" in md and "## Rows" in md
    table = md.split("## Rows")[1].split("## Planner")[0]
    assert "## Planner" in md  # writescope's rows report the planner's state
    assert sum(line.startswith(f"| {next(iter(doc['models']))} |") for line in table.splitlines()) == len(rows)
    header = next(line for line in table.splitlines() if line.startswith("| model |"))
    cols = [c.strip() for c in header.strip().strip("|").split("|")]
    assert {"model ms", "planner ms", "bound ms"} <= set(cols)
    for line in table.splitlines():  # every row has a cell under every column
        if line.startswith(f"| {next(iter(doc['models']))} |"):
            assert len(line.strip().strip("|").split("|")) == len(cols)
    pngs = sorted(p.name for p in grid.glob("*.png"))
    assert len(pngs) == 2 and any(p.startswith("throughput-") for p in pngs)
    for p in grid.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["summary"][next(iter(doc["models"]))]["speedup_over"].keys() >= {
        "transfer", "cpu", "static", "migrate", "transformers"}
    ok_rows = [r for r in rows if not r.get("error") and not r.get("peer")]
    assert ok_rows and all(0.0 <= r["host_bound_fraction"] <= 1.0 for r in ok_rows)
    meta = next(iter(doc["models"].values()))
    # static's share is chosen once, at the grid's longest context and largest batch
    assert meta["static_share_from"] == "roofline target share at 3000 tokens, batch 2"
    assert set(meta["engine_build_times"]) == {"weights_s", "pin_experts_s", "activations_s"}
    assert sum(meta["engine_build_times"].values()) <= meta["engine_build_s"]
    assert len(doc["meta"]["git"]["source_digest"]) == 16


def test_failed_rows_do_not_stop_the_run(grid):
    rows = _strict_json(grid / "results.json")["rows"]
    long = [r for r in rows if r["context"] == 3000]
    assert len(long) == 12 and all("max_model_len" in r["error"] for r in long)
    short = [r for r in rows if r["context"] != 3000]
    assert short and all(not r.get("error") for r in short), [r.get("error") for r in short]
    for r in short:
        assert r["decode_tokens_per_s"] > 0 and len(r["step_times_s"]) == 8
        assert r["p50_step_s"] <= r["p99_step_s"] and r["ttft_s"] > 0
        if not r["peer"]:  # no Triton kernel compiles on the CPU
            assert r["jit_compiles"] == []
        if not r["peer"]:  # the first timed call opens the window (row.py): not counted
            later = r["step_times_s"][1:]
            assert r["decode_tokens_per_s"] == pytest.approx(r["batch"] * 7 / sum(later))
            assert r["mean_step_s"] == pytest.approx(sum(later) / 7)
        if not r["peer"]:  # (the peer's peak is measured on CUDA only)
            assert 0 < r["peak_vram_bytes"] <= r["vram_budget"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peer_runs_with_its_offloaded_cache(tiny_qwen3_moe, tmp_path):
    """On CUDA the transformers peer runs generate with its offloaded cache under the budget
    (the allocator cap needs an indexed device: a bare "cuda" failed every peer row on the
    H200, bench/results/2026-12-01c-h200/call3) and decodes writescope's greedy tokens."""
    from test_migrate import synthetic_profile
    from writescope.cli import main
    prof = tmp_path / "profile.json"
    synthetic_profile().save(prof)
    rc = main(["bench", "--model", str(tiny_qwen3_moe), "--dtype", "float32", "--device", "cuda",
               "--block-size", "16", "--profile", str(prof), "--out", str(tmp_path),
               "--no-progress", "--batch", "2", "--context-lengths", "64", "--decode-steps", "4",
               "--policies", "writescope", "--peer", "transformers", "--vram-budget", "4GiB"])
    assert rc == 0
    rows = _strict_json(tmp_path / "results.json")["rows"]
    (peer,) = [r for r in rows if r["peer"]]
    assert not peer.get("error"), peer["error"]
    assert peer["peer_cache"] == "offloaded"
    assert 0 < peer["peak_vram_bytes"] <= peer["vram_budget"]
    assert peer["same_tokens_as_writescope"] == 1.0
    assert peer["first_divergence"] == [None, None]


def test_first_divergence_reads_the_peers_logits_where_the_tokens_part():
    from writescope.bench.peers import first_divergence
    V = 6
    lp = [torch.log_softmax(torch.randn(2, V), -1) for _ in range(3)]
    lp[1][1] = torch.log(torch.tensor([0.05, 0.5, 0.3, 0.05, 0.05, 0.05]))
    ref = [[1, 2, 3], [4, 2, 5]]
    peer = [[1, 2, 3], [4, 1, 0]]
    d = first_divergence(ref, peer, lp)
    assert d[0] is None
    assert d[1]["step"] == 1 and d[1]["peer_token"] == 1 and d[1]["writescope_token"] == 2
    assert d[1]["gap_nats"] == pytest.approx(math.log(0.5 / 0.3), rel=1e-5)
    assert d[1]["writescope_token_rank"] == 1
    assert d[1]["peer_top2_margin_nats"] == pytest.approx(math.log(0.5 / 0.3), rel=1e-5)
    rows = [{"model": "m", "batch": 2, "context": 64, "policy": "transformers", "peer": True,
             "first_divergence": d}]
    assert "step 1, gap 0.5108 nats, writescope's token ranked 2" in markdown({"rows": rows})


def test_only_migrate_moves_bytes_and_all_decode_the_same_tokens(grid):
    rows = [r for r in _strict_json(grid / "results.json")["rows"] if not r.get("error")]
    moved = {p: sum(r["bytes_moved"] for r in rows if r["policy"] == p) for p in POLICIES}
    assert moved["migrate"] > 0
    assert all(moved[p] == 0 for p in POLICIES if p != "migrate"), moved
    for key in {(r["batch"], r["context"]) for r in rows}:
        cell = [r for r in rows if (r["batch"], r["context"]) == key]
        assert len(cell) == len(POLICIES) + 1
        assert len({r["output_digest"] for r in cell}) == 1, key
        peer = next(r for r in cell if r["peer"])
        assert peer["same_tokens_as_writescope"] == 1.0
        assert peer["first_divergence"] == [None] * peer["batch"]
        for r in cell:  # the CPU share trace has one value per decode step
            if not r["peer"]:
                assert len(r["cpu_share_steps"]) == 8
                assert all(0.0 <= x <= 1.0 for x in r["cpu_share_steps"])
    cpu = [r for r in rows if r["policy"] == "cpu"]
    transfer = [r for r in rows if r["policy"] == "transfer"]
    assert all(r["cpu_share_mean"] > 0 for r in cpu) and all(r["cpu_share_mean"] == 0 for r in transfer)
    assert all(r["host_used_bytes"] == 0 for r in transfer)
    assert all(r["model_step_s"] > 0 and r["roofline_bound_s"] > 0 for r in rows if not r["peer"])


def test_rounds_run_the_policies_again_in_alternating_order(tiny_qwen3_moe, tmp_path):
    """--rounds 2: each policy's rows twice, the second round in reverse order, every row with
    its round; the summary pairs rows within a round."""
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "1", "--context-lengths", "40",
                   "--decode-steps", "3", "--num-gpu-blocks", "4", "--policies",
                   "writescope,transfer", "--rounds", "2", "--max-num-batched-tokens", "256")
    assert rc == 0
    rows = _strict_json(tmp_path / "results.json")["rows"]
    assert [(r["policy"], r["round"]) for r in rows] == [
        ("writescope", 0), ("transfer", 0), ("transfer", 1), ("writescope", 1)]
    assert all(not r.get("error") for r in rows)
    s = _strict_json(tmp_path / "results.json")["summary"]
    assert s[rows[0]["model"]]["speedup_over"]["transfer"]["pairs"] == 0  # 40 tokens < 8K
    md = (tmp_path / "results.md").read_text()
    assert "| writescope (round 2) |" in md and "| transfer (round 1) |" in md
    # the planner table names both of writescope's rounds, as the rows table does
    planner = md[md.index("## Planner"):]
    assert "| writescope (round 1) |" in planner and "| writescope (round 2) |" in planner


def test_report_only_rewrites_the_report(grid):
    from writescope.cli import main
    (grid / "results.md").unlink()
    for p in grid.glob("*.png"):
        p.unlink()
    assert main(["bench", "--report", str(grid)]) == 0
    assert (grid / "results.md").exists() and len(list(grid.glob("*.png"))) == 2
    assert _strict_json(grid / "results.json")["summary"]


def test_report_merges_several_runs(grid, tmp_path):
    from writescope.cli import main
    assert main(["bench", "--report", str(grid), str(grid), "--out", str(tmp_path)]) == 0
    merged = _strict_json(tmp_path / "results.json")
    assert len(merged["rows"]) == 2 * len(_strict_json(grid / "results.json")["rows"])
    assert len(merged["meta"]["sources"]) == 2
    assert merged["models"] and all(k.endswith(f"({grid})") for k in merged["models"])


def test_provenance_digest_tracks_sources(tmp_path, monkeypatch):
    """Results carry a digest of the package sources: equal trees give equal digests, any edit to
    a source file changes it (the device copy's git HEAD can be stale)."""
    from writescope.bench import provenance
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "x.py").write_text("x = 1\n")
    (a / "sub" / "k.cpp").write_text("int k;\n")
    (a / "notes.txt").write_text("ignored\n")
    d0 = provenance.source_digest(a)
    assert len(d0) == 16 and d0 == provenance.source_digest(a)
    (a / "notes.txt").write_text("still ignored\n")
    assert provenance.source_digest(a) == d0
    (a / "sub" / "k.cpp").write_text("int k = 2;\n")
    assert provenance.source_digest(a) != d0
    info = provenance.git_info()
    assert set(info) == {"commit", "dirty", "source_digest"}
    monkeypatch.setenv("WRITESCOPE_GIT_COMMIT", "abc")
    assert provenance.git_commit() == "abc"


def test_step_profile_counts_a_decode_steps_ops(tiny_deepseek_v2, tmp_path, capsys):
    from writescope.bench import step_profile
    out = tmp_path / "p.json"
    assert step_profile.main(["--model", str(tiny_deepseek_v2), "--batch", "2", "--context", "40",
                              "--warmup", "1", "--steps", "2", "--top", "5",
                              "--num-gpu-blocks", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["aten_ops_per_step"] > 100 and res["layers"] == 3
    assert 0 < res["forward_host_s"] <= res["step_s"]
    assert len(res["top_host_ops"]) == 5
    # the cache's timed step is part of engine.step's; the rest is the host's work around it
    assert 0 < res["cache_step_s"] < res["step_s_unprofiled"]
    assert 0 < res["outside_cache_step_s"] < res["step_s_unprofiled"]
    assert step_profile.main(["--model", str(tiny_deepseek_v2), "--batch", "2", "--context", "0.25k",
                              "--warmup", "1", "--steps", "2", "--top", "3", "--prefill",
                              "synthetic", "--num-gpu-blocks", "1", "--timeline",
                              "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["prefill"] == "synthetic" and res["aten_ops_per_step"] > 100
    assert "aten ops" in capsys.readouterr().out
    assert "cprofile" not in res
    # --timeline without CUDA: no native queue's calls, so no chain (and no failure)
    assert "cpu_chain" not in res


def test_step_profile_takes_config_overrides_and_kv_cache_memory(tiny_deepseek_v2, tmp_path):
    """The rows `writescope bench` runs with --config-override and --kv-cache-memory (the FP8
    release's config, the split of experts against KV) can be profiled in the same form."""
    from writescope.bench import step_profile
    out = tmp_path / "p.json"
    assert step_profile.main(["--model", str(tiny_deepseek_v2), "--random-weights", "--batch", "2",
                              "--context", "40", "--warmup", "1", "--steps", "1", "--top", "3",
                              "--config-override", "num_hidden_layers=2",
                              "--kv-cache-memory", "1MiB", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["layers"] == 2
    with pytest.raises(SystemExit):  # a checkpoint's tensors fix its config
        step_profile.main(["--model", str(tiny_deepseek_v2), "--config-override",
                           "num_hidden_layers=2"])
    with pytest.raises(SystemExit):
        step_profile.main(["--model", str(tiny_deepseek_v2), "--random-weights",
                           "--config-override", "num_hidden_layers"])


def test_step_profile_splits_a_step_along_its_expert_chain(capsys):
    """--timeline: the chain's device times (ms) split into the device's work between calls,
    the calls' spans, their CPU kernels (the queue's seconds) and the hand-off left over."""
    from writescope.bench import step_profile
    marks = [(0.0, 1.0), (1.5, 3.0), (3.2, 4.0)]
    c = step_profile.chain_split(marks, 0.006, 0.002, (3, 0.0009, 0.002), 2_000_000,
                                 [0.05, None, 0.04])
    assert c["calls"] == 3 and c["result_ms"] == pytest.approx(0.09)
    assert c["calls_ms"] == pytest.approx(3.3) and c["device_between_ms"] == pytest.approx(0.7)
    assert c["kernels_ms"] == pytest.approx(2.0) and c["handoff_ms"] == pytest.approx(1.3)
    assert c["outside_ms"] == pytest.approx(2.0) and c["queue_wait_ms"] == pytest.approx(0.9)
    assert c["kernel_gbps"] == pytest.approx(1.0)
    step_profile.print_chain(c)
    out = capsys.readouterr().out
    assert "3 calls, step 6.0 ms = outside the chain 2.0" in out
    assert "results from seen to on the device (copy or in-place read): 0.09 ms (30 us" in out
    # on the host's clock: call 1 was queued 0.3 ms after call 0 was done, its inputs came
    # 0.1 ms later; the launching thread queued a call every 1.5 ms
    calls = [dict(enter=0.0, pushed=1e-4, wait=2e-4, popped=1e-4, ready=3e-4, done=13e-4),
             dict(enter=12e-4, pushed=16e-4, wait=17e-4, popped=16e-4, ready=17e-4, done=27e-4)]
    h = step_profile.host_chain(calls)
    assert h["host_kernels_ms"] == pytest.approx(2.0) and h["launcher_per_call_ms"] == pytest.approx(1.5)
    assert h["launcher_late_ms"] == pytest.approx(0.3) and h["device_late_ms"] == pytest.approx(0.1)
    assert h["pickup_ms"] == pytest.approx(0.3) and step_profile.host_chain([]) == {}
    empty = step_profile.chain_split([], 0.006, None, None, None)
    assert empty["calls"] == 0 and empty["outside_ms"] == pytest.approx(6.0)
    assert empty["result_ms"] != empty["result_ms"]  # NaN: nothing marked
    step_profile.print_chain(empty)
    assert "no eager CPU expert calls timed" in capsys.readouterr().out


def test_step_profile_lists_python_functions_by_host_time(tiny_deepseek_v2, tmp_path, capsys):
    from writescope.bench import step_profile
    out = tmp_path / "p.json"
    assert step_profile.main(["--model", str(tiny_deepseek_v2), "--batch", "2", "--context", "0.25k",
                              "--warmup", "1", "--steps", "1", "--top", "8", "--prefill",
                              "synthetic", "--num-gpu-blocks", "1", "--cprofile", "2",
                              "--json", str(out)]) == 0
    cp = json.loads(out.read_text())["cprofile"]
    assert cp["steps"] == 2 and cp["wall_ms_per_step"] > 0
    assert len(cp["by_self"]) == 8 and len(cp["by_cum"]) == 8
    cum = [r["cum_ms_per_step"] for r in cp["by_cum"]]
    assert cum == sorted(cum, reverse=True)
    # the step itself is among the most expensive functions, cumulatively
    assert any("(step)" in r["function"] for r in cp["by_cum"])
    assert "cProfile, 2 steps" in capsys.readouterr().out


def test_cpu_attention_bench_parses_sizes_as_printed():
    from writescope.bench import cpu_attention
    with pytest.raises(SystemExit, match="BATCHxLENGTH"):
        cpu_attention.main(["--sizes", "8xlots", "--shapes", "gqa-32/4/128", "--reps", "1",
                            "--read-bytes", "1048576"])


def test_cpu_attention_bench_takes_shape_families_and_refuses_unknown_shapes():
    from writescope.bench import cpu_attention
    with pytest.raises(SystemExit, match="unknown shape 'mlx'.*mla-16/1/576.*family: gqa, mla"):
        cpu_attention.main(["--shapes", "mlx", "--reps", "1", "--read-bytes", "1048576"])
    with pytest.raises(SystemExit, match="BATCHxLENGTH"):  # "mla" was accepted: sizes are next
        cpu_attention.main(["--shapes", "mla", "--sizes", "1xlots", "--reps", "1",
                            "--read-bytes", "1048576"])
    for bad in ("-1,2", "two"):  # a clear error, not the kernel's ValueError mid-run
        with pytest.raises(SystemExit, match="prefetch-blocks"):
            cpu_attention.main([f"--prefetch-blocks={bad}", "--reps", "1", "--read-bytes", "1048576"])


def test_cpu_attention_bench_runs_the_variant_a_profile_chose(tmp_path, monkeypatch):
    """--isa profile: each shape runs the variant a calibration chose for its attention family
    (here an invented choice, the AVX2 kernel, for GQA 32/4/128), the kernel's own choice for a
    family the profile does not name; --isa VARIANT forces one; bad input is a clear error."""
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU attention kernel")
    from writescope.bench import cpu_attention
    from writescope.planner.profile import HardwareProfile
    assert cpu_attention.shape_family("gqa-32/4/128") == "gqa-g8-d128"
    assert cpu_attention.shape_family("gqa-32/8/128") == "gqa-g4-d128"
    assert cpu_attention.shape_family("mla-16/1/576") == "mla-h16-r576"
    p = HardwareProfile(machine={"cpu": "synthetic"}, cpu_threads=1, cpu_read_Bps=1e10,
                        cpu_attn={"gqa-g8-d128": {"C": 1e9, "T": 1e9}},
                        device_attn={"gqa-g8-d128": 1e6}, cpu_expert={"h64-i48": 1e12},
                        cpu_roundtrip_s=0.0, launch_s=0.0,
                        cpu_attn_isa={"gqa-g8-d128": "avx2"},
                        cpu_attn_prefetch_blocks={"gqa-g8-d128": 3})
    path = tmp_path / "p.json"
    p.save(path)
    args = ["--sizes", "1x300", "--shapes", "gqa-32/4/128,mla-16/1/576", "--reps", "1",
            "--torch-reps", "0", "--no-variants", "--no-gpu-layout", "--read-bytes", str(1 << 22)]
    # an engine built earlier in this process may have set this machine's calibrated variant
    setting = cpu.current_isa_setting()
    res = cpu_attention.main(args + ["--isa", "profile", "--profile", str(path)])
    assert res["profile"] == str(path) and res["isa_setting"] == "profile"
    assert [r["kernel_isa"] for r in res["rows"]] == ["avx2", cpu.get_isa()]
    before = cpu.get_prefetch_blocks()
    assert [r["prefetch_blocks"] for r in res["rows"]] == [3, before]  # the profile's distance
    assert cpu.current_isa_setting() == setting  # the caller's settings are back
    res = cpu_attention.main(args + ["--isa", "avx2"])
    assert {r["kernel_isa"] for r in res["rows"]} == {"avx2"}
    monkeypatch.setattr(cpu, "_isa", "avx2")  # as $WRITESCOPE_CPU_ATTN_ISA=avx2 sets it: auto keeps it
    res = cpu_attention.main(args)
    assert {r["kernel_isa"] for r in res["rows"]} == {"avx2"} and cpu.current_isa_setting() == "avx2"
    monkeypatch.setattr(cpu, "_isa", "auto")
    monkeypatch.setenv("WRITESCOPE_PROFILE", str(path))  # the engine's profile, without --profile
    res = cpu_attention.main(args[:3] + ["gqa-32/4/128"] + args[4:] + ["--isa", "profile"])
    assert res["rows"][0]["kernel_isa"] == "avx2"
    with pytest.raises(SystemExit, match="--isa sse9"):
        cpu_attention.main(args + ["--isa", "sse9"])
    with pytest.raises(SystemExit, match="no such file"):
        cpu_attention.main(args + ["--isa", "profile", "--profile", str(tmp_path / "none.json")])
    with pytest.raises(SystemExit, match="--isa profile sets the profile's distances"):
        cpu_attention.main(args + ["--isa", "profile", "--profile", str(path), "--prefetch-blocks", "1"])
    with pytest.raises(SystemExit, match="--profile goes with --isa profile"):
        cpu_attention.main(args + ["--profile", str(path)])


def test_cpu_attention_bench_rows_against_the_best_read_probe(tmp_path):
    """Tiny sizes: every row carries median and best rates, the probes of the run and fractions
    of the best probe; a prefetch sweep adds its rates."""
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU attention kernel")
    from writescope.bench import cpu_attention
    out = tmp_path / "c.json"
    res = cpu_attention.main(["--sizes", "1x300,2x100", "--shapes", "mla", "--reps", "2",
                              "--torch-reps", "0", "--no-variants", "--no-gpu-layout",
                              "--prefetch-blocks", "0,3", "--read-bytes", str(1 << 22),
                              "--json", str(out)])
    assert len(res["read_bw_probes_gbps"]) == 3  # the first, and one beside each shape
    assert res["read_bw_gbps"] == max(res["read_bw_probes_gbps"])
    for r in res["rows"]:
        assert r["kernel_best_gbps"] >= r["kernel_gbps"] > 0
        assert r["kernel_frac_of_read_bw"] == pytest.approx(r["kernel_gbps"] / res["read_bw_gbps"])
        assert set(r["kernel_gbps_by_prefetch_blocks"]) == {"0", "3"}
        assert r["paired_frac_of_read_bw"] > 0
    assert json.loads(out.read_text())["rows"][1]["batch"] == 2
    # the kernel's calls rotate through copies of each shape's KV spanning the probe's array
    assert all(r["kv_sets"] == -(-(1 << 22) // r["kv_bytes"]) > 1 for r in res["rows"])
    # every shape's pool is carved from one arena as large as the largest of them, read before
    # the first shape (a probe this small is read from cache: the arena is not settled against it)
    assert all(r["pool_memory"] == "arena" for r in res["rows"])
    assert res["arena_bytes"] == max(cpu_attention.case_bytes("mla-16/1/576", b, l, 64, 1 << 22)
                                     for b, l in ((1, 300), (2, 100)))
    assert len(res["arena_settle"]) == 2 and all(t["probe_gbps"] is None for t in res["arena_settle"])
    new = cpu_attention.main(["--sizes", "1x300", "--shapes", "mla", "--reps", "1", "--torch-reps", "0",
                              "--no-variants", "--pool-memory", "new", "--read-bytes", str(1 << 22)])
    assert new["rows"][0]["pool_memory"] == "new" and "arena_bytes" not in new
    assert new["rows"][0]["kernel_gbps_gpu_layout"] > 0
    # the array read every other way at the start, beside each shape and at the end; the rows
    # against the best rate of any of them, and paired with one pass of each
    want = {"vector+pf", "torch.sum"} | ({"tile", "tile+pf"} if "amx" in cpu.isas() else set())
    assert len(res["read_bw_by_method_gbps"]) == 4
    assert all(set(d) == want for d in res["read_bw_by_method_gbps"])
    best = max([res["read_bw_gbps"]] + [v for d in res["read_bw_by_method_gbps"] for v in d.values()])
    assert res["best_read_bw_gbps"] == best and res["best_read_method"] in want | {"vector"}
    for r in res["rows"]:
        assert r["kernel_frac_of_best_read_bw"] == pytest.approx(r["kernel_gbps"] / best)
        # each pair's best denominator is at least its vector probe
        assert 0 < r["paired_frac_of_best_read_bw"] <= r["paired_frac_of_read_bw"]


def test_cpu_attention_bench_pools_carved_from_an_arena_hold_the_same_case():
    """A decode case built in an arena lies at the arena's start and attends exactly as the
    same case in a pool of its own; a settled arena is read until it keeps pace with a probe."""
    import torch
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU attention kernel")
    from writescope.bench import cpu_attention as ca
    need = ca.case_bytes("gqa-32/4/128", 2, 300, 64, 1 << 21)
    arena, trace = ca.settled_arena(need + 1, None)
    assert arena.numel() % 64 == 0 and arena.numel() >= need + 1 and len(trace) == 2
    cases = [ca.decode_case("gqa-32/4/128", 2, 300, 64, torch.Generator().manual_seed(3), 1 << 21,
                            arena=a) for a in (None, arena)]
    (spec, pool, bbs, q, scale, kv), (_, apool, abbs, aq, _, akv) = cases
    assert apool.data_ptr() == arena.data_ptr() and apool.numel() * 2 == need and kv == akv
    assert torch.equal(pool, apool) and len(bbs) == len(abbs) > 1
    for b, ab in zip(bbs, abbs):
        o, lse = cpu.attend_cpu(q, pool, "cpu", spec, b, scale)
        ao, alse = cpu.attend_cpu(aq, apool, "cpu", spec, ab, scale)
        assert torch.equal(o, ao) and torch.equal(lse, alse)
    # against a probe: pairs of passes until the arena reads at least frac of the probe twice
    probe = cpu.probe_buffer(1 << 20)
    _, trace = ca.settled_arena(1 << 20, probe, max_s=30.0, frac=0.0)
    assert len(trace) == 2 and all(t["probe_gbps"] > 0 for t in trace)
    _, trace = ca.settled_arena(1 << 20, probe, max_s=0.0, frac=1e9)  # never keeps pace: one pair
    assert len(trace) == 1


def test_cpu_phases_bench_splits_the_kernels_time_and_computes_what_the_normal_build_does(tmp_path):
    """The -DWS_PHASES build returns the same (out, lse) as the normal one, its four phases cover
    most of each call, another variant (--isa) runs over the same pools with no phase counts,
    and the command refuses a shape or a variant it does not know."""
    from writescope.attention import cpu
    if not cpu.available() or not cpu.features()["avx512_bf16"]:
        pytest.skip("needs the compiled kernel with AVX-512 BF16 (AMX or its emulation)")
    from writescope.attention.batch import BlockBatch
    from writescope.bench import cpu_phases
    from writescope.bench.cpu_attention import SHAPES
    from writescope.kvcache.regions import cpu_pool_shape
    lib = cpu_phases.phase_library()
    r = cpu_phases.measure(lib, "gqa-32/4/128", 0.25, 0.05, 1, blocks=48)
    assert r["calls"] >= 1 and r["pool_blocks"] == 2 and r["kernel_gbps"] > 0
    ph = r["phase_ns_per_group"]
    assert set(ph) == set(cpu_phases.PHASES)
    assert all(ph[p] > 0 for p in ("qk", "softmax", "pv"))
    assert 0.5 < r["phases_frac_of_time"] <= 1.05
    spec_fn, hq = SHAPES["mla-16/1/576"]
    spec = spec_fn()
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(cpu_pool_shape(spec, 6, 64)[1:], generator=gen).to(spec.dtype)
    bb = BlockBatch.build([1, 1], [[4, 1, 2], [0, 5]], [[64, 64, 17], [64, 3]])
    q = torch.randn(2, hq, spec.k_dim, generator=gen).to(torch.bfloat16)
    try:
        with cpu.use_library(lib):
            cpu.set_isa("amx")
            o1, l1 = cpu.attend_cpu(q, pool, "cpu", spec, bb, 0.07)
        if "amx" in cpu.isas():  # the normal build runs the same kernel on real tiles
            o2, l2 = cpu.attend_cpu(q, pool, "cpu", spec, bb, 0.07)
            assert torch.equal(o1, o2) and torch.equal(l1, l2)
    finally:
        cpu.set_isa("auto")
    ref_o, ref_l = attend_torch(q, pool, "cpu", spec, bb, 0.07)
    assert torch.allclose(o1, ref_o, atol=2e-2, rtol=2e-2)
    with pytest.raises(SystemExit, match="unknown shape 'mlx'"):
        cpu_phases.main(["--shapes", "mlx"])
    # --defines: builds to compare side by side; the empty entry is the default build
    assert cpu_phases.parse_variants(";WS_KSB=128;WS_KSB=512, WS_PHASES") == [
        (), ("WS_KSB=128",), ("WS_KSB=512", "WS_PHASES")]
    with pytest.raises(SystemExit, match="WS_NAME=VALUE"):
        cpu_phases.main(["--defines", "KSB=1"])
    # --isa: another variant over the same pools (no phase counters: its phases stay 0)
    r = cpu_phases.measure(lib, "gqa-32/4/128", 0.25, 0.05, 1, blocks=48, isa="avx512bf16")
    assert r["isa"] == "avx512bf16" and r["kernel_gbps"] > 0
    assert not any(r["phase_ns_per_group"].values())
    with pytest.raises(SystemExit, match="--isa avx9"):
        cpu_phases.main(["--isa", "avx9"])


def test_cpu_contention_bench_runs_both_cases(tmp_path):
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU attention kernel")
    from writescope.bench import cpu_contention
    res = cpu_contention.main(["--size", "2x300", "--reps", "3", "--gap-ms", "0",
                               "--json", str(tmp_path / "c.json")])
    assert [r["spinners"] for r in res["rows"]] == [0, 1]
    assert all(r["p50_ms"] > 0 and r["gbps_p50"] > 0 for r in res["rows"])
    assert json.loads((tmp_path / "c.json").read_text())["kv_bytes"] == 2 * 300 * 576 * 2
    res = cpu_contention.main(["--size", "2x300", "--reps", "2", "--gap-ms", "0", "--spinners",
                               "0", "--chunk-blocks", "0,2"])
    assert [r["chunk_blocks"] for r in res["rows"]] == [0, 2]


def test_policy_overhead_bench_reports_host_time_and_collections(tmp_path):
    from writescope.bench import policy_overhead
    res = policy_overhead.main(["--policies", "transfer,writescope", "--batch", "2", "--prompt",
                                "200", "--steps", "3", "--json", str(tmp_path / "o.json")])
    assert [r["policy"] for r in res["rows"]] == ["transfer", "writescope"]
    for r in res["rows"]:
        assert r["begin_step_ms"] > 0 and r["end_step_ms"] > 0 and r["gc_collections"] >= 0
        assert r["schedule_ms"] > 0 and r["sample_ms"] > 0 and r["apply_ms"] > 0
        parts = ("begin_step", "end_step", "schedule", "sample", "apply")
        assert r["host_ms"] == pytest.approx(sum(r[f"{k}_ms"] for k in parts))
    assert (tmp_path / "o.json").exists()


def test_warm_up_verifies_the_planner_so_the_row_prefill_places_c_blocks(tiny_qwen3_moe, tmp_path):
    """The warm-up decodes long enough for the writescope planner to measure its CPU path, so a
    row's prefill already places spilled blocks where the planner wants them (here: all on the
    CPU, whose attention this profile makes 1000x faster and nearly free to start) instead of in
    T only, as an unverified planner does."""
    import dataclasses

    from test_migrate import synthetic_profile

    fast = dataclasses.replace(synthetic_profile(), cpu_roundtrip_s=1e-6)
    fast.validate()
    # G holds 128 tokens: the warm-up's short requests (64 tokens) never spill, so only
    # its long request (200 tokens, as long as the row's) can show the planner the CPU
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "1", "--context-lengths", "200",
                   "--decode-steps", "4", "--num-gpu-blocks", "16", "--policies", "writescope",
                   "--max-num-batched-tokens", "256", profile=fast)
    assert rc == 0
    (row,) = _strict_json(tmp_path / "results.json")["rows"]
    assert not row.get("error"), row.get("error")
    assert row["planner_verified"] is True
    # every spilled block in C (72 of ~202 tokens: G holds 128), and the CPU attends them all
    assert row["host_used_bytes"] > 0 and row["pinned_used_bytes"] == 0
    assert row["cpu_share_mean"] > 0.3
    # the planner's state when the prefill had placed the blocks, and after the decode steps
    for st in (row["planner_at_prefill"], row["planner_after"]):
        assert st["cpu_verified"] is True and st["target_share"] > 0.3
        assert all(st[k] > 0 for k in ("cpu_rate_correction", "pcie_rate_correction",
                                        "expert_rate_correction"))
    assert row["pcie_gbps"] is None  # nothing streamed (no T block)
    md = (tmp_path / "results.md").read_text()
    assert "| target, prefill | CPU | link | GPU | target, after |" in md
    planner = md.split("## Planner")[1]
    assert any("| writescope | " in line and line.count("|") == 14
               for line in planner.splitlines())


def test_link_rate_of_a_step_needs_timed_copies():
    from writescope.bench.row import link_gbps, planner_state
    assert link_gbps({"pcie_s": 0.1, "t_bytes": 5e9}) == pytest.approx(50.0)
    assert link_gbps({"pcie_s": None, "t_bytes": 5e9}) is None  # an untimed step
    assert link_gbps({"t_bytes": 0, "pcie_s": 0.0}) is None
    from writescope.kvcache.placement import make_policy
    assert planner_state(make_policy("transfer")) == {"cpu_share": 0.0}  # a fixed share only


@pytest.mark.parametrize("prefill", ["real", "synthetic"])
def test_a_warm_up_that_fits_in_g_spills_to_verify_the_planner(tiny_qwen3_moe, tmp_path, prefill):
    """A warm-up whose long request fits in G (--warmup-length 16) cannot show the planner its
    CPU path; the spill warm-up then fills G and spills with random KV and decodes, so the row
    still starts with a verified planner and places its spill in C (the profile makes the CPU
    1000x faster and nearly free to start)."""
    import dataclasses

    from test_migrate import synthetic_profile

    fast = dataclasses.replace(synthetic_profile(), cpu_roundtrip_s=1e-6)
    fast.validate()
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "1", "--context-lengths", "200",
                   "--decode-steps", "4", "--num-gpu-blocks", "16", "--policies", "writescope",
                   "--max-num-batched-tokens", "256", "--warmup-length", "16",
                   "--prefill", prefill, profile=fast)
    assert rc == 0
    (row,) = _strict_json(tmp_path / "results.json")["rows"]
    assert not row.get("error"), row.get("error")
    assert row["planner_verified"] is True
    assert row["host_used_bytes"] > 0 and row["pinned_used_bytes"] == 0


def test_spill_warm_up_spills_past_g_and_frees_its_blocks(tiny_qwen3_moe):
    """The spill warm-up fills G and spills past it (in at most max_num_seqs requests of at
    most max_model_len tokens), decodes, and leaves every block free again."""
    from writescope import LLM
    from writescope.bench.row import WARMUP_SPILL_BLOCKS, warm_up_spill
    from writescope.kvcache.regions import Region

    eng = LLM(str(tiny_qwen3_moe), dtype="float32", device="cpu", block_size=8,
              max_model_len=256, max_num_seqs=4, num_gpu_blocks=40, kv_policy="transfer",
              max_num_batched_tokens=128).engine
    regions = (Region.G, Region.T, Region.C, Region.W)
    free0 = {r: eng.cache.alloc[r].num_free for r in regions}
    spilled = warm_up_spill(eng, 100, 0)
    # 40 blocks of G + 64 spilled = 104 blocks in 4 requests of 26 blocks (208 tokens)
    assert spilled == WARMUP_SPILL_BLOCKS * 8
    assert eng.counters["engine.synthetic_prefill_tokens"] == 4 * (26 * 8 - 1)
    assert not eng.has_unfinished_requests()
    assert {r: eng.cache.alloc[r].num_free for r in regions} == free0


def test_a_malformed_budget_is_the_commands_error(tmp_path, capsys):
    from writescope.cli import main
    rc = main(["bench", "--model", "deepseek-v2-lite", "--random-weights", "--vram-budget", "12XB",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 1 and "--vram-budget: cannot read '12XB' as a byte size" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_a_bad_model_is_the_commands_error_before_any_row(tmp_path, capsys):
    """An unknown name, a reference name without --random-weights, and config overrides of a
    checkpoint are the command's error, said once before anything is built: no grid of rows
    that all fail the same way, and no results.json."""
    from writescope.cli import main
    for args, said in ((["--model", "no-such-model", "--random-weights"], "neither a folder nor"),
                       (["--model", "qwen3-30b-a3b"], "names a reference config without weights"),
                       (["--model", "qwen3-30b-a3b", "--config-override", "hidden_size=64"],
                        "--config-override needs --random-weights")):
        rc = main(["bench", *args, "--out", str(tmp_path), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 1 and said in err and "[bench]" not in err, err
        assert not (tmp_path / "results.json").exists()


def test_a_run_whose_every_row_failed_exits_nonzero(tiny_qwen3_moe, tmp_path, capsys):
    """Rows that cannot run fail and the run goes on (issue 6); when none of them ran the
    command says so and exits 1, with the rows and their reasons written."""
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "1", "--context-lengths", "3000",
                   "--decode-steps", "2", "--policies", "transfer,writescope")
    err = capsys.readouterr().err
    assert rc == 1 and "every row failed" in err
    rows = _strict_json(tmp_path / "results.json")["rows"]
    assert len(rows) == 2 and all("max_model_len" in r["error"] for r in rows)


def test_warmup_length_is_checked(tmp_path, capsys):
    from writescope.cli import main
    rc = main(["bench", "--model", "nonexistent-model", "--warmup-length", "1", "--out",
               str(tmp_path), "--no-progress"])
    assert rc == 1 and "--warmup-length must be at least 2" in capsys.readouterr().err


def test_cpu_expert_rows_carry_the_bytes_their_experts_read(tiny_qwen3_moe, tmp_path):
    """Experts on the CPU: a row says so, carries the expert bytes its decode steps read
    (distinct experts, at most top-k per token and layer) and a bound that charges them."""
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "2", "--context-lengths", "40",
                   "--decode-steps", "3", "--policies", "transfer", "--experts", "cpu")
    assert rc == 0
    (row,) = _strict_json(tmp_path / "results.json")["rows"]
    assert not row.get("error"), row.get("error")
    assert row["experts"] == "cpu"
    from writescope.models.config import ModelConfig
    cfg = ModelConfig.from_hf(str(tiny_qwen3_moe))
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4  # float32
    most = len(cfg.moe_layers) * min(cfg.num_experts, 2 * cfg.num_experts_per_tok) * per_expert
    assert len(cfg.moe_layers) * per_expert <= row["cpu_expert_bytes_measured"] <= most
    assert row["roofline_bound_s"] > 0
    # and the seconds they took per step, which the rows table shows, next to the host's DRAM
    # read bandwidth probed just before and after the decode steps
    assert 0 < row["cpu_expert_s_mean"] < row["mean_step_s"]
    before, after = row["cpu_read_gbps"]
    assert before > 0 and after > 0
    table = (tmp_path / "results.md").read_text()
    assert "CPU experts ms" in table and "CPU read GB/s" in table
    read = "-".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in (before, after))
    assert f"| {row['cpu_expert_s_mean'] * 1e3:.4g} | {read} |" in table
    # and how many of the timed steps ran as two sub-batches
    assert 0 <= row["pipelined_steps"] <= len(row["step_times_s"]) == 3
    assert f" | {row['pipelined_steps']} of 3 |  |" in table
    # and which threads burnt CPU during the decode steps: the launching thread among them
    th = row["threads_decode"]
    assert th["threads"] >= 1 and 0 < th["wall_s"] <= sum(row["step_times_s"]) * 1.5 + 1
    assert th["process_cpu_s"] >= max(t["cpu_s"] for t in th["top"]) > 0
    assert any(t["name"] == "MainThread" for t in th["top"])


def test_busy_threads_finds_a_spinning_thread():
    """A thread spinning through a stretch shows as busy for about all of it; an idle one not."""
    import threading
    import time
    from writescope.bench.threads import busy_threads, snapshot
    stop = threading.Event()
    spin = threading.Thread(target=lambda: [None for _ in iter(lambda: stop.is_set(), True)],
                            name="spinner")
    idle = threading.Thread(target=stop.wait, name="idler")
    spin.start(), idle.start()
    a, t0 = snapshot(), time.perf_counter()
    time.sleep(0.6)
    b = snapshot()
    r = busy_threads(a, b, time.perf_counter() - t0, top=10 ** 6)  # every thread
    stop.set(), spin.join(), idle.join()
    by = {t["name"]: t for t in r["top"]}
    # (the spinner has a core to itself on an idle machine, ~1.0; CI's two test processes on
    # two cores leave it less, so the figure's own scale is not asserted)
    assert r["top"][0]["name"] == "spinner" and by["spinner"]["frac"] > 0.2, r
    assert by["idler"]["cpu_s"] < 0.05, r
    assert r["busy_over_half"] == sum(t["frac"] > 0.5 for t in r["top"]) and r["threads"] >= 3
    assert busy_threads({}, b, 1.0) is None
    # a thread that waited switched out voluntarily; the counts are deltas over the stretch
    go, done, stop = threading.Event(), threading.Event(), threading.Event()

    def sleeper():
        go.wait()
        for _ in range(20):
            time.sleep(0.002)
        done.set()
        stop.wait()
    waiter = threading.Thread(target=sleeper, name="sleeper")
    waiter.start()
    a = snapshot()
    go.set(), done.wait()
    b = snapshot()
    stop.set(), waiter.join()
    by = {t["name"]: t for t in busy_threads(a, b, 0.05, top=10 ** 6)["top"]}
    assert 20 <= by["sleeper"]["vcsw"] <= 24 and by["sleeper"]["ivcsw"] >= 0, by["sleeper"]


def test_python_probe_times_a_fixed_loop():
    from writescope.bench.threads import python_probe_us
    short, long = python_probe_us(n=2000), python_probe_us(n=200000)
    assert 0 < short < long


def test_synthetic_prefill_rows(tiny_qwen3_moe, tmp_path):
    """--prefill synthetic: each row's prompts get random KV in the homes the policy chooses
    (all but the last token), then the same timed decode steps; no TTFT."""
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "2", "--context-lengths", "150",
                   "--decode-steps", "3", "--num-gpu-blocks", "8",
                   "--policies", "writescope,transfer,cpu", "--max-num-batched-tokens", "64",
                   "--prefill", "synthetic")
    assert rc == 0
    doc = _strict_json(tmp_path / "results.json")
    assert doc["meta"]["spec"]["prefill"] == "synthetic"
    for r in doc["rows"]:
        assert not r.get("error"), r.get("error")
        assert r["prefill"] == "synthetic" and r["ttft_s"] is None
        assert r["synthetic_fill_tokens"] == 2 * 149 and r["decode_tokens_per_s"] > 0
    by = {r["policy"]: r for r in doc["rows"]}
    assert by["transfer"]["host_used_bytes"] == 0 and by["transfer"]["pinned_used_bytes"] > 0
    assert by["cpu"]["pinned_used_bytes"] == 0 and by["cpu"]["host_used_bytes"] > 0
    for r in doc["rows"]:
        assert r["pipelined_steps"] == 0 and r["cpu_attn_threads"] >= 1
        # (no staging ring on a CPU-only machine: T blocks are in the device's memory there)
        assert r["staging_plans"] == {"made": 0, "reused": 0}
    with pytest.raises(ValueError, match="peer"):
        GridSpec(models=["m"], batches=[1], context_lengths=[8], peers=["transformers"],
                 prefill="synthetic").validate()


def test_rows_count_pipelined_steps(tiny_qwen3_moe, tmp_path, monkeypatch):
    """With WRITESCOPE_PIPELINE=1 (and the decode step as pieces, as on CUDA) a row whose CPU
    side has work records how many of its timed decode steps ran as two sub-batches."""
    from writescope.attention import cpu
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "1")
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    before = cpu.num_threads_setting()
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "2", "--context-lengths", "150",
                   "--decode-steps", "3", "--num-gpu-blocks", "8", "--policies", "cpu",
                   "--max-num-batched-tokens", "64", "--prefill", "synthetic",
                   "--cpu-threads", "1")
    # an engine's explicit count is its own plans', not the process's kernel setting
    assert cpu.num_threads_setting() == before
    assert rc == 0
    (row,) = _strict_json(tmp_path / "results.json")["rows"]
    assert not row.get("error"), row.get("error")
    assert row["pipelined_steps"] == 3 and row["cpu_attn_threads"] == 1


def test_rows_with_overlapped_steps(tiny_qwen3_moe, tmp_path, monkeypatch):
    """WRITESCOPE_ASYNC_DECODE=1 (CUDA's default): a row with all KV in G records how many of
    its timed decode steps overlapped the step before, and its tokens are the row's without
    overlap (the timed loop does not wait for the step in flight)."""
    rows = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", mode)
        out = tmp_path / mode
        out.mkdir()
        rc = bench_cli(tiny_qwen3_moe, out, "--batch", "2", "--context-lengths", "150",
                       "--decode-steps", "6", "--num-gpu-blocks", "64", "--policies", "writescope",
                       "--max-num-batched-tokens", "64", "--prefill", "synthetic")
        assert rc == 0
        (rows[mode],) = _strict_json(out / "results.json")["rows"]
        assert not rows[mode].get("error"), rows[mode].get("error")
    assert rows["0"]["overlapped_steps"] == 0
    assert rows["1"]["overlapped_steps"] == 6  # those completing a block in G too
    assert rows["1"]["output_token_ids"] == rows["0"]["output_token_ids"]


def test_rows_with_spread_lengths(tiny_qwen3_moe, tmp_path, monkeypatch, capsys):
    """--length-spread N: prompt i of a batch of B is N*i/B tokens shorter than the context.
    With a block's worth (8) over 4 sequences, they complete their blocks on four different
    steps of every eight; with all KV in G those steps overlap too (none of them did with
    WRITESCOPE_G_BLOCKS_ON_DEVICE=0, as before the sixty-fourth session: 4 of 8). The tokens are the
    synchronous row's; bad spreads are the command's error."""
    rows = {}
    for mode in ("0", "1", "1-off"):
        monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", mode[0])
        monkeypatch.setenv("WRITESCOPE_G_BLOCKS_ON_DEVICE", "0" if mode.endswith("off") else "1")
        out = tmp_path / mode
        out.mkdir()
        rc = bench_cli(tiny_qwen3_moe, out, "--batch", "4", "--context-lengths", "150",
                       "--decode-steps", "8", "--num-gpu-blocks", "128", "--policies", "writescope",
                       "--max-num-batched-tokens", "64", "--prefill", "synthetic",
                       "--length-spread", "8")
        assert rc == 0
        doc = _strict_json(out / "results.json")
        (rows[mode],) = doc["rows"]
        assert not rows[mode].get("error"), rows[mode].get("error")
        assert doc["meta"]["spec"]["length_spread"] == 8
        assert "--length-spread" in (out / "results.md").read_text()
    assert rows["0"]["prompt_lengths"] == [150, 148, 146, 144]
    assert rows["0"]["overlapped_steps"] == 0 and rows["1"]["overlapped_steps"] == 8
    assert rows["1-off"]["overlapped_steps"] == 4
    assert rows["1"]["output_token_ids"] == rows["0"]["output_token_ids"] \
        == rows["1-off"]["output_token_ids"]
    capsys.readouterr()
    for bad in (("--length-spread", "149"), ("--length-spread", "8", "--peer", "transformers"),
                ("--length-spread", "1GiB")):
        rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "4", "--context-lengths", "150", *bad)
        err = capsys.readouterr().err
        assert rc == 1 and ("--length-spread" in err or "byte size" in err), err


def test_rows_say_which_step_form_auto_chose(tiny_qwen3_moe, tmp_path, monkeypatch):
    """With WRITESCOPE_PIPELINE=auto a row records, per batch size, the form the chooser settled
    on and each form's median step; without it, nothing."""
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "auto")
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "2", "--context-lengths", "150",
                   "--decode-steps", "8", "--num-gpu-blocks", "8", "--policies", "writescope",
                   "--max-num-batched-tokens", "64", "--prefill", "synthetic", "--cpu-threads", "1")
    assert rc == 0
    (row,) = _strict_json(tmp_path / "results.json")["rows"]
    assert not row.get("error"), row.get("error")
    forms = row["step_forms"]["2 seqs, 256+ tokens"]
    assert forms["choice"] in ("single", "pipelined") and forms["single_ms"] > 0
    assert forms["pipelined_ms"] > 0 and 0 < row["pipelined_steps"] < 8


def test_read_probes_bench_times_every_way_of_reading(tmp_path):
    """Each method once per round on a small array: the vector sum with and without its
    prefetch, torch's sum, and the tile unit's loads where the CPU has AMX."""
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU kernel library")
    from writescope.bench import read_probes
    res = read_probes.main(["--threads", "1,2", "--rounds", "2", "--read-bytes", str(1 << 22),
                            "--no-h2d", "--json", str(tmp_path / "r.json")])
    want = {"vector", "vector+pf", "torch.sum"} | ({"tile", "tile+pf"} if "amx" in cpu.isas() else set())
    assert {r["method"] for r in res["rows"]} == want
    assert [r["threads"] for r in res["rows"]] == [1] * len(want) + [2] * len(want)
    for r in res["rows"]:
        assert len(r["alone_GBps"]) == 2 and r["alone_best_GBps"] == max(r["alone_GBps"]) > 0
        assert "beside_h2d" not in r
    assert json.loads((tmp_path / "r.json").read_text())["array_bytes"] == 1 << 22
    for bad in (["--threads", "0"], ["--threads", "x"], ["--rounds", "0"]):
        with pytest.raises(SystemExit, match="--threads"):
            read_probes.main(bad + ["--read-bytes", str(1 << 22), "--no-h2d"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_read_probes_bench_beside_the_link():
    """With a GPU every method is also timed beside a sustained pinned H2D copy (the hybrid's
    combined ceiling): both rates present and positive for every round."""
    from writescope.bench import read_probes
    res = read_probes.main(["--threads", "2", "--rounds", "1", "--read-bytes", str(1 << 26)])
    for r in res["rows"]:
        assert len(r["beside_h2d"]) == 1
        assert r["beside_h2d"][0]["cpu_GBps"] > 0 and r["beside_h2d"][0]["h2d_GBps"] > 0


def test_cpu_ab_times_two_builds_call_by_call(tmp_path):
    """bench.cpu_ab: another copy of the kernel's sources (here the same files, so the same
    cached library and bit-identical outputs) against the working tree's, one call of each per
    round on the same pool; git revisions through --against; the tree's own sources with a
    compile-time knob through --defines; bad input refused."""
    import shutil
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip(f"the CPU kernel is not available: {cpu.load_error()}")
    from writescope.bench import cpu_ab
    src = tmp_path / "csrc"
    shutil.copytree(cpu._CSRC, src)
    res = cpu_ab.main(["--csrc", str(src), "--shapes", "gqa-32/4/128,mla-16/1/576", "--sizes", "1x1k,2x300",
                       "--reps", "3", "--threads", "2", "--cold-bytes", str(1 << 22),
                       "--json", str(tmp_path / "ab.json")])
    assert [(r["shape"], r["batch"], r["length"]) for r in res["rows"]] == [
        ("gqa-32/4/128", 1, 1024), ("gqa-32/4/128", 2, 300), ("mla-16/1/576", 1, 1024), ("mla-16/1/576", 2, 300)]
    for r in res["rows"]:
        # the calls rotate through copies of the KV that span --cold-bytes
        assert r["kv_sets"] == -(-(1 << 22) // r["kv_bytes"]) > 1
        assert set(r["gbps"]) == {"this tree", str(src)}
        assert all(len(v) == 3 and min(v) > 0 for v in r["gbps"].values())
        assert r["ratio"] > 0 and r["threads"] == 2
        assert r["max_abs_out_diff"] == 0.0 and r["max_abs_lse_diff"] == 0.0
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert saved["against"] == str(src) and saved["command"].startswith("python -m writescope.bench.cpu_ab")
    assert cpu.num_threads_setting() is None  # the caller's settings are back
    # a revision through git: HEAD's kernel (the working tree's in a clean checkout)
    if shutil.which("git") and (cpu_ab.REPO / ".git").exists():
        res = cpu_ab.main(["--against", "HEAD", "--shapes", "gqa-32/4/128", "--sizes", "1x512", "--reps", "1",
                           "--cold-bytes", "0"])
        assert res["against"] == "HEAD" and len(res["rows"]) == 1 and res["rows"][0]["kv_sets"] == 1
        with pytest.raises(SystemExit, match="--against no-such-revision"):
            cpu_ab.main(["--against", "no-such-revision"])
    with pytest.raises(SystemExit, match="missing attn_ops.cpp"):
        cpu_ab.main(["--csrc", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown shape 'mlx'"):
        cpu_ab.main(["--csrc", str(src), "--shapes", "mlx"])
    with pytest.raises(SystemExit, match="is not BATCHxLENGTH"):
        cpu_ab.main(["--csrc", str(src), "--sizes", "8by32k"])
    with pytest.raises(SystemExit):  # neither --against nor --csrc
        cpu_ab.main([])
    # this tree's sources with a compile-time knob set: the AMX kernel's, so the build differs
    # while the AVX-512 / AVX2 kernels these CPUs run compute the same bits
    res = cpu_ab.main(["--cold-bytes", "4194304", "--defines", "WS_QK_PF=0", "--shapes", "gqa-32/4/128", "--sizes", "1x512", "--reps", "1"])
    assert res["against"] == "-DWS_QK_PF=0" and res["rows"][0]["max_abs_out_diff"] == 0.0
    for bad in ("QK_PF=0", "WS_QK_PF=0;", ""):
        with pytest.raises(SystemExit, match="--defines"):
            cpu_ab.main(["--defines", bad])
    # several builds in one run, each against this tree's, in rotating order
    res = cpu_ab.main(["--cold-bytes", "4194304", "--defines", "WS_QK_PF=0;WS_QK_PF=0,WS_PV_PF=0", "--shapes", "mla-16/1/576",
                       "--sizes", "1x300", "--reps", "3"])
    r = res["rows"][0]
    assert set(r["ratios"]) == {"-DWS_QK_PF=0", "-DWS_QK_PF=0 -DWS_PV_PF=0"}
    assert all(len(v) == 3 for v in r["gbps"].values()) and len(r["gbps"]) == 3
    assert r["max_abs_out_diff"] == 0.0  # prefetches and copy order never change a result
    # --layouts: every build on the C pool and on the same records in the T (GPU) layout
    res = cpu_ab.main(["--cold-bytes", "4194304", "--layouts", "C,T", "--shapes", "mla-16/1/576", "--sizes", "1x300", "--reps", "2"])
    r = res["rows"][0]
    assert set(r["gbps"]) == {"this tree [C]", "this tree [T]"} and set(r["ratios"]) == {"this tree [T]"}
    assert r["max_abs_out_diff"] < 1e-2  # the same KV read from either layout
    res = cpu_ab.main(["--cold-bytes", "4194304", "--layouts", "T", "--defines", "WS_PV_PAR=0", "--shapes", "gqa-32/4/128",
                       "--sizes", "1x300", "--reps", "1"])
    assert set(res["rows"][0]["gbps"]) == {"this tree", "-DWS_PV_PAR=0"}
    for bad in ("C,X", "", "C,C"):
        with pytest.raises(SystemExit, match="--layouts"):
            cpu_ab.main(["--layouts", bad, "--defines", "WS_QK_PF=0"])
    with pytest.raises(SystemExit, match="--layouts C,T"):
        cpu_ab.main(["--layouts", "C"])  # nothing to compare


def test_block_orders_cover_the_same_blocks_per_set():
    """cpu_attention.block_sets: every order's set k holds exactly the ids of set k's range (so
    calls rotating through sets never reread memory, whatever their order), each sequence
    ``nb_seq`` of them; contiguous and lockstep lay them out as the engine's allocators would."""
    from writescope.bench.cpu_attention import ORDERS, block_sets, decode_lens
    gen = torch.Generator().manual_seed(0)
    batch, nb_seq, sets = 3, 5, 2
    lens = decode_lens(batch, 5 * 64 - 10, 64)
    assert lens == [[64, 64, 64, 64, 54]] * 3
    got = {o: block_sets(o, sets, batch, nb_seq, lens, gen) for o in ORDERS}
    for o, bbs in got.items():
        assert len(bbs) == sets and all(bb.kv_lens.tolist() == sum(lens, []) for bb in bbs), o
    for k in range(sets):
        base = k * batch * nb_seq
        per = {o: _seq_blocks(got[o][k], batch) for o in ORDERS}
        for o, blocks in per.items():
            assert sorted(b for seq in blocks for b in seq) == list(range(base, base + batch * nb_seq)), o
            assert all(len(seq) == nb_seq for seq in blocks)
        assert per["contiguous"][1] == list(range(base + nb_seq, base + 2 * nb_seq))
        assert per["lockstep"][1] == list(range(base + 1, base + batch * nb_seq, batch))
    with pytest.raises(ValueError, match="block order 'sorted'"):
        block_sets("sorted", 1, 1, 1, [[64]], gen)


def _seq_blocks(bb, batch):
    """Each sequence's block ids, in order, from a BlockBatch of one query per sequence."""
    ids, starts = bb.kv_blocks.tolist(), bb.kv_indptr.tolist()
    return [ids[starts[i]:starts[i + 1]] for i in range(batch)]


def test_cpu_ab_times_block_orders_and_prefetch_distances(tmp_path):
    """bench.cpu_ab --orders / --prefetch-blocks: this tree's build on each block order and at each
    AMX prefetch distance, call by call; the same order computes the same bits at every distance
    (a prefetch never changes a result); bad lists refused."""
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip(f"the CPU kernel is not available: {cpu.load_error()}")
    from writescope.bench import cpu_ab
    before = cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()
    res = cpu_ab.main(["--orders", "contiguous,scattered", "--prefetch-blocks", "0,2", "--shapes", "mla-16/1/576",
                       "--sizes", "2x700", "--reps", "2", "--threads", "2", "--cold-bytes", str(1 << 22),
                       "--json", str(tmp_path / "ab.json")])
    (r,) = res["rows"]
    names = ["this tree [contiguous] [pf 0]", "this tree [contiguous] [pf 2]",
             "this tree [scattered] [pf 0]", "this tree [scattered] [pf 2]"]
    assert list(r["gbps"]) == names and set(r["ratios"]) == set(names[1:])
    assert r["variants"][names[3]] == {"build": "this tree", "layout": "C", "order": "scattered",
                                       "prefetch_blocks": 2}
    assert all(len(v) == 2 and min(v) > 0 for v in r["gbps"].values())
    assert r["out_diffs"][names[1]] == 0.0 and r["out_diffs"][names[3]] == 0.0
    assert (cpu.get_prefetch_blocks(), cpu.prefetch_chosen_by_user()) == before  # settings back
    for bad in ("contiguous,contiguous", "sorted", ""):
        with pytest.raises(SystemExit, match="--orders"):
            cpu_ab.main(["--orders", bad])
    for bad in ("1,x", "-1,2", "2,2"):
        with pytest.raises(SystemExit, match="--prefetch-blocks"):
            cpu_ab.main([f"--prefetch-blocks={bad}"])


def test_h2d_copies_bench_patterns_and_cpu_only_exit(capsys):
    from writescope.attention.staging import strided_copies
    from writescope.bench import h2d_copies
    for name, (runs_n, per_run, spacing, _) in h2d_copies.PATTERNS.items():
        runs = [(i * spacing + spacing - per_run, i * per_run, per_run) for i in range(runs_n)]
        assert len(strided_copies(runs)) == 1, name  # one strided copy per layer
        assert len(strided_copies(runs, strided=False)) == runs_n
    if not torch.cuda.is_available():
        assert h2d_copies.main([]) == {}
        assert "needs CUDA" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_h2d_copies_bench_on_the_device(tmp_path):
    from writescope.bench import h2d_copies
    out = h2d_copies.main(["--patterns", "singles", "--layers", "2", "--reps", "1",
                           "--cpu-read-threads", "0", "--json", str(tmp_path / "h.json")])
    (row,) = out["rows"]
    assert row["runs"]["dma_calls_per_layer"] == 512 and row["strided"]["dma_calls_per_layer"] == 1
    assert all(row[c]["GBps"] > 0 for c in ("one", "runs", "strided"))


def test_throughput_plots_start_at_zero(tmp_path, monkeypatch):
    """The throughput axes start at 0 tokens/s: policies that did the same work differ by a few
    per cent, and an axis fitted to 14-16 tokens/s drew that noise as gaps (2026-12-03b grid)."""
    import matplotlib.figure
    from writescope.bench.report import plot
    limits = {}
    save = matplotlib.figure.Figure.savefig

    def record(fig, path, *a, **k):
        limits[Path(path).name] = [ax.get_ylim() for ax in fig.axes]
        return save(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    rows = [_row(p, 1, n, tps) for p, n, tps in [("writescope", 1024, 15.0), ("transfer", 1024, 14.8),
                                                    ("writescope", 32768, 15.1), ("transfer", 32768, 15.8)]]
    plot({"rows": rows}, tmp_path)
    (lim,) = limits["throughput-m.png"]
    assert lim[0] == 0 and lim[1] > 15.8


def test_policy_variants_are_parsed_and_refused_when_malformed():
    from writescope.bench.grid import split_variant
    assert split_variant("writescope") == ("writescope", {})
    assert split_variant("writescope@placement_cpu_margin=1.0@verify_steps=3") == (
        "writescope", {"placement_cpu_margin": 1.0, "verify_steps": 3.0})
    for bad in ("writescope@margin", "writescope@margin=x", "@margin=1", "writescope@_x=1",
                "writescope@margin=nan", "writescope@a b=1"):
        with pytest.raises(ValueError):
            split_variant(bad)
    with pytest.raises(ValueError, match="attr=number"):
        GridSpec(models=["m"], batches=[1], context_lengths=[8],
                 policies=["writescope", "writescope@margin"]).validate()


def _variant_rows(model, tmp_path, monkeypatch, policies: str, probe, *extra: str):
    """A small grid over ``policies``: its rows, and ``probe(engine)`` at each row's start
    (``extra``: more CLI arguments, later ones overriding these)."""
    from writescope.bench import grid
    seen = []
    real = grid.run_engine_row

    def spy(engine, prompts, *a, **k):
        seen.append(probe(engine))
        return real(engine, prompts, *a, **k)
    monkeypatch.setattr(grid, "run_engine_row", spy)
    rc = bench_cli(model, tmp_path, "--batch", "2", "--context-lengths", "100",
                   "--decode-steps", "4", "--num-gpu-blocks", "8", "--max-num-batched-tokens", "64",
                   "--prefill", "synthetic", "--cpu-threads", "1", "--policies", policies, *extra)
    assert rc == 0
    return _strict_json(tmp_path / "results.json")["rows"], seen


def test_a_policy_variant_runs_with_its_setting(tiny_qwen3_moe, tmp_path, monkeypatch):
    """``writescope@placement_cpu_margin=1.0`` runs writescope with that attribute set on its
    placement policy (the rows' label is the variant); a setting the policy does not have fails
    that policy's rows with the reason, and the grid goes on."""
    rows, seen = _variant_rows(
        tiny_qwen3_moe, tmp_path, monkeypatch,
        "writescope,writescope@placement_cpu_margin=1.0,static@no_such_knob=2",
        lambda engine: getattr(engine.cache.policy, "placement_cpu_margin", None))
    assert [r["policy"] for r in rows] == ["writescope", "writescope@placement_cpu_margin=1.0",
                                           "static@no_such_knob=2"]
    assert not rows[0].get("error") and not rows[1].get("error")
    assert "has no numeric setting 'no_such_knob'" in rows[2]["error"]
    from writescope.planner.placement import PLACEMENT_CPU_MARGIN
    assert seen == [PLACEMENT_CPU_MARGIN, 1.0]  # static's row failed before it ran


def test_an_expert_threads_variant_sets_the_cpu_experts_team(tiny_qwen3_moe, tmp_path, monkeypatch):
    """``writescope@expert_threads=1`` runs that policy's rows with a one-thread CPU experts'
    team, and a policy without the setting after it with the engine's own again (the rows
    record both); a count that is not a whole number fails that row."""
    from writescope.bench import grid
    from writescope.layers import cpu_experts, cpu_experts_lib
    monkeypatch.setattr(cpu_experts_lib, "_num_threads", None)
    seen = []
    real = grid.run_engine_row

    def spy(engine, prompts, *a, **k):
        seen.append(cpu_experts.get_num_threads())
        return real(engine, prompts, *a, **k)
    monkeypatch.setattr(grid, "run_engine_row", spy)
    rc = bench_cli(tiny_qwen3_moe, tmp_path, "--batch", "2", "--context-lengths", "100",
                   "--decode-steps", "3", "--num-gpu-blocks", "8", "--max-num-batched-tokens", "64",
                   "--prefill", "synthetic", "--cpu-threads", "1", "--experts", "cpu", "--policies",
                   "writescope@expert_threads=1,writescope,writescope@expert_threads=0.5")
    assert rc == 0
    rows = _strict_json(tmp_path / "results.json")["rows"]
    own = cpu_experts_lib.default_threads()
    assert seen == [1, own]
    assert [r.get("cpu_expert_threads") for r in rows[:2]] == [1, own]
    assert not rows[0].get("error") and not rows[1].get("error")
    assert "expert_threads must be a whole number" in rows[2]["error"]
    # the last policy a variant: the engine's own team size is back when the grid is done
    (tmp_path / "again").mkdir()
    rc = bench_cli(tiny_qwen3_moe, tmp_path / "again", "--batch", "1", "--context-lengths", "64",
                   "--decode-steps", "2", "--num-gpu-blocks", "8", "--max-num-batched-tokens", "64",
                   "--prefill", "synthetic", "--cpu-threads", "1", "--experts", "cpu", "--policies",
                   "writescope,writescope@expert_threads=1")
    assert rc == 0 and seen[-1] == 1 and cpu_experts.num_threads_setting() is None


def test_split_spilled_and_team_lock_variants_set_the_engine_s_steps(tiny_qwen3_moe, tmp_path,
                                                                   monkeypatch):
    """``writescope@split_spilled=1`` runs that policy's rows with the runner splitting spilled
    decode steps into two sub-batches with the experts on the CPU (its rows count split steps;
    the engine's own setting keeps them whole), ``writescope@team_lock=0`` with the CPU job
    queues' lock off; the policies after them, and the engine after the grid, have the engine's
    own settings back. A value other than 0 or 1 fails that row."""
    from writescope.attention import cpu as cpu_attention
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")  # (the piecewise steps on the CPU)
    rows, seen = _variant_rows(
        tiny_qwen3_moe, tmp_path, monkeypatch,
        "writescope@split_spilled=1,writescope,writescope@team_lock=0,writescope@split_spilled=2",
        lambda engine: (engine.runner.expert_pipeline, cpu_attention.team_lock()),
        "--experts", "cpu")
    own = seen[1][0]
    assert own != "all" and seen == [("all", True), (own, True), (own, False)]
    assert not any(r.get("error") for r in rows[:3])
    assert "split_spilled must be 0 or 1" in rows[3]["error"]
    assert rows[0]["pipelined_steps"] > 0 and rows[1]["pipelined_steps"] == 0
    assert rows[0]["output_token_ids"] == rows[1]["output_token_ids"] == rows[2]["output_token_ids"]
    assert cpu_attention.team_lock() is True


def test_a_cpu_threads_variant_sets_the_cache_s_attention_team(tiny_qwen3_moe, tmp_path, monkeypatch):
    """``writescope@cpu_threads=2`` runs writescope with the CPU attention kernel's calls planned
    for two threads in that policy's cache (the row records it), the plain policy with
    ``--cpu-threads``; a count that is not a whole number fails that row and the grid goes on."""
    rows, seen = _variant_rows(tiny_qwen3_moe, tmp_path, monkeypatch,
                               "writescope,writescope@cpu_threads=2,writescope@cpu_threads=1.5",
                               lambda engine: engine.cache.hybrid.cpu_threads)
    assert seen == [1, 2]
    assert [r.get("cpu_attn_threads") for r in rows[:2]] == [1, 2]
    assert not rows[0].get("error") and not rows[1].get("error")
    assert "whole number" in rows[2]["error"]


def test_naps_bench_alternates_the_two_slack_settings(tmp_path, monkeypatch):
    """``bench.naps`` on the CPU: each round measures a nap under both settings (the CUDA round
    trips only where there is a GPU), writes every round and the medians, and leaves the
    caller's setting as it found it."""
    from writescope.bench import naps
    monkeypatch.setenv("WRITESCOPE_TIMER_SLACK_NS", "3000")
    out = tmp_path / "naps.json"
    assert naps.main(["--rounds", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["median"]) == set(naps.SETTINGS)
    for s in naps.SETTINGS:
        assert len(doc["rounds"][s]["nap_us"]) == 2
        assert all(v >= 20.0 for v in doc["rounds"][s]["nap_us"])  # a nap never ends early
    assert os.environ["WRITESCOPE_TIMER_SLACK_NS"] == "3000"


def test_cpu_ab_takes_a_revision_from_before_a_header(tmp_path, monkeypatch):
    """``--against`` an older revision: a header added to the kernel since (here one no revision
    has) is left out of the copy instead of failing it; a missing source still fails."""
    import subprocess
    from writescope.attention import cpu
    from writescope.bench import cpu_ab
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=cpu_ab.REPO, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    monkeypatch.setattr(cpu, "_HEADERS", cpu._HEADERS + ("attn_from_the_future.h",))
    out = cpu_ab.revision_csrc("HEAD", tmp_path)
    assert (out / "attn_amx.cpp").is_file() and not (out / "attn_from_the_future.h").exists()
    monkeypatch.setattr(cpu, "_SOURCES", cpu._SOURCES + ("attn_from_the_future.cpp",))
    (tmp_path / "x").mkdir()
    with pytest.raises(SystemExit, match="attn_from_the_future.cpp"):
        cpu_ab.revision_csrc("HEAD", tmp_path / "x")


def test_an_expert_link_variant_sets_the_links_share(tiny_qwen3_moe, tmp_path, monkeypatch):
    """``writescope@expert_link=0.5`` runs that policy's rows with the link taking half of the
    small decode steps' CPU experts (layers/expert_link.py; forced off CUDA), a policy without
    it with the engine's own share (0: off by default); the rows record the share and
    the calls, and a share outside [0, 1] fails its row."""
    rows, seen = _variant_rows(  # all KV in G: no step streams, the link may take experts
        tiny_qwen3_moe, tmp_path, monkeypatch,
        "writescope@expert_link=0.5,writescope,writescope@expert_link=2",
        lambda engine: engine.expert_link.share, "--experts", "cpu", "--num-gpu-blocks", "64")
    assert seen == [0.5, 0.0]
    assert rows[0]["expert_link"]["share"] == 0.5 and rows[0]["expert_link"]["calls"] > 0
    assert rows[1]["expert_link"]["share"] == 0.0
    assert not rows[0].get("error") and not rows[1].get("error")
    assert rows[0]["output_token_ids"] == rows[1]["output_token_ids"]
    assert "expert_link must be a share" in rows[2]["error"]


def test_expert_link_bench_needs_cuda():
    """``python -m writescope.bench.expert_link`` times the link: without CUDA it says so and
    exits 2 (no traceback)."""
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    from writescope.bench import expert_link
    assert expert_link.main([]) == 2


def test_sampler_bench_times_both_ways(tmp_path):
    from writescope.bench import sampler
    out = tmp_path / "s.json"
    assert sampler.main(["--device", "cpu", "--batch", "2", "--reps", "1", "--vocab", "500",
                         "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["setting"] for r in rows] == list(sampler.SETTINGS)
    assert all(r["batch"] == 2 and r["batched_ms"] > 0 and r["seeded_ms"] > 0 for r in rows)


def test_structured_bench_masks_the_constrained_runs_only(tiny_qwen3_moe, tmp_path):
    pytest.importorskip("llguidance")
    from writescope.bench import structured
    out = tmp_path / "s.json"
    assert structured.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                            "float32", "--batch", "2", "--max-tokens", "8",
                            "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["constraint"] for r in rows] == list(structured.CONSTRAINTS)
    for r in rows:
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0
        assert (r["rows_masked"] > 0) == (r["constraint"] != "free")
        assert (r["mask_us_per_row"] > 0) == (r["constraint"] != "free")


def test_prefix_cache_bench_finds_the_first_turn(tiny_qwen3_moe, tmp_path):
    from writescope.bench import prefix_cache
    out = tmp_path / "p.json"
    assert prefix_cache.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                              "float32", "--contexts", "150", "--answer", "4", "--turn", "8",
                              "--reps", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    # every record of the first turn (150 + 4 - 1): 2 blocks of 64 and its kept tail of 25
    assert row["cached_tokens_off"] == 0 and row["cached_tokens_on"] == 153
    assert row["next_prompt_tokens"] == 162 and row["ttft_on_ms"] > 0 and row["speedup"] > 0


def test_shared_prefix_bench_starts_every_follower_from_the_first_prompts_blocks(
        tiny_qwen3_moe, tmp_path, monkeypatch):
    """Both modes on one engine: each follower finds the shared prefix's blocks, the timed steps
    decode the whole batch, and the switch the bench sets is put back afterwards."""
    from writescope.bench import shared_prefix
    monkeypatch.delenv("WRITESCOPE_STAGE_SHARED", raising=False)
    out = tmp_path / "s.json"
    assert shared_prefix.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                               "float32", "--prefix", "150", "--suffix", "5", "--batch", "3",
                               "--num-gpu-blocks", "2", "--decode-steps", "3",
                               "--kv-policies", "transfer,writescope", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kv_policy"], r["mode"]) for r in rows] == [
        ("transfer", "once"), ("transfer", "each"), ("writescope", "once"), ("writescope", "each")]
    for r in rows:
        assert r["cached_tokens_min"] == 128  # the prefix's 2 full blocks of 64
        assert r["shared_blocks"] == 2  # held by all three while timed
        assert r["stats"]["prefix.shared_blocks"] == 0  # every request aborted and freed
        assert r["decode_tok_s"] > 0 and r["attended_gb_per_step"] > 0
        assert r["link_gb_per_step"] == 0  # the CPU's T pool is not staged
        assert len(r["step_ms"]) == len(r["gc_ms"]) == 3 and r["round"] == 0
        assert max(r["step_ms"]) >= r["p50_step_ms"] and r["slowest_step_timing"]["step_s"] > 0
        assert isinstance(r["jit_compiles"], list) and len(r["host_attend_ms"]) == 3
    assert "WRITESCOPE_STAGE_SHARED" not in os.environ
    assert shared_prefix.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                               "float32", "--prefix", "150", "--suffix", "5", "--batch", "2",
                               "--num-gpu-blocks", "2", "--decode-steps", "1", "--modes", "once",
                               "--rounds", "2", "--kv-policies", "writescope,transfer",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["round"], r["kv_policy"]) for r in rows] == [
        (0, "writescope"), (0, "transfer"), (1, "writescope"), (1, "transfer")]
    for bad in (["--modes", "twice"], ["--kv-policies", "fast"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            shared_prefix.main(bad)


def test_the_embedded_model_by_the_name_it_is_served_under(tmp_path, monkeypatch):
    """``--model writescope-default`` (the name the server lists) is the embedded default model,
    as no ``--model`` is for ``generate``: the same config and weights; a folder of that name in
    the working directory wins."""
    from writescope.engine.model_source import DEFAULT_NAME, resolve_model
    from writescope.models.default import default_model_path
    cfg, ckpt, name = resolve_model(DEFAULT_NAME, False)
    cfg0, ckpt0, name0 = resolve_model(None, False)
    assert (ckpt, name) == (ckpt0, name0) == (default_model_path(), DEFAULT_NAME)
    assert cfg == cfg0
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_NAME).mkdir()
    with pytest.raises(ValueError, match="no config.json"):  # the folder, not the embedded model
        resolve_model(DEFAULT_NAME, False)


def test_jit_compiles_records_each_compile_and_restores_the_hook():
    """``bench.jit_log.jit_compiles`` puts a hook on Triton's in-process cache misses for the
    block's length (a real compile calls it with these keywords), records each, passes the
    call on to a hook set before, and puts that one back."""
    from writescope.bench.jit_log import jit_compiles
    knobs = pytest.importorskip("triton").knobs
    seen = []
    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw["repr"]) or False
    try:
        with jit_compiles() as log:
            assert log.available
            assert knobs.runtime.jit_cache_hook(key=1, repr="kern[num_warps=4](x: *fp32)",
                                                fn=None, compile={}, is_manual_warmup=False,
                                                already_compiled=False) is False
        assert [k for _, k in log] == ["kern[num_warps=4](x: *fp32)"] and log[0][0] >= 0
        assert seen == ["kern[num_warps=4](x: *fp32)"]
        assert knobs.runtime.jit_cache_hook is not None and \
            knobs.runtime.jit_cache_hook(repr="y") is False and seen[-1] == "y"
    finally:
        knobs.runtime.jit_cache_hook = before


def test_the_flag_kernels_do_not_specialise_on_their_slot_or_value():
    """The device-side flag kernels take a step's or a call's number: Triton would compile a new
    specialisation when it first reaches a multiple of 16 (a ~60 ms decode step, see
    ``attention/hostflag.py``). Checked where the kernels are defined (no GPU needed); the
    compile count itself is ``test_gpu_attention``'s."""
    pytest.importorskip("triton")
    from writescope.attention.hostflag import _kernel, _store_kernel
    assert {"FLAG", "expected"} <= set(_kernel().fn.do_not_specialize)
    assert {"FLAG", "value"} <= set(_store_kernel().fn.do_not_specialize)


def test_beam_search_bench_times_beam_and_decode_steps(tiny_qwen3_moe, tmp_path):
    from writescope.bench import beam_search
    out = tmp_path / "b.json"
    assert beam_search.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                             "float32", "--contexts", "40", "--beam-width", "2", "--steps", "3",
                             "--reps", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["context"] == 40 and row["beam_width"] == 2
    assert 0 < row["add_requests_ms"] < row["beam_step_ms"] and row["decode_step_ms"] > 0
    assert "cprofile" not in json.loads(out.read_text())
    with pytest.raises(SystemExit):
        beam_search.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--steps", "1"])
    with pytest.raises(SystemExit):
        beam_search.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--cprofile", "1"])


def test_beam_search_bench_profiles_beam_steps(tiny_qwen3_moe, tmp_path, capsys):
    """``--cprofile N``: a search of N steps at the longest context, its N - 1 steps after the
    first under cProfile; the engine's step is among the functions by cumulative time."""
    from writescope.bench import beam_search
    out = tmp_path / "b.json"
    assert beam_search.main(["--model", str(tiny_qwen3_moe), "--device", "cpu", "--dtype",
                             "float32", "--contexts", "24", "40", "--beam-width", "2", "--steps",
                             "2", "--reps", "1", "--cprofile", "4", "--top", "30",
                             "--json", str(out)]) == 0
    cp = json.loads(out.read_text())["cprofile"]
    assert cp["context"] == 40 and cp["steps"] == 3 and cp["wall_ms_per_step"] > 0
    assert len(cp["by_cum"]) == 30
    step = [r for r in cp["by_cum"] if r["function"].endswith("(step)") and "engine.py" in r["function"]]
    assert step and step[0]["calls_per_step"] == 1.0
    assert "cProfile, 3 steps" in capsys.readouterr().out


def test_fresh_pages_bench_reads_new_buffers_pass_by_pass(tmp_path):
    """Every trial's passes, timed from the buffer's write; the kernel trial marks each KV
    set's first read; bad input refused."""
    from writescope.attention import cpu
    if not cpu.available():
        pytest.skip("no C++ compiler for the CPU attention kernel")
    from writescope.bench import fresh_pages
    out = tmp_path / "f.json"
    res = fresh_pages.main(["--gib", "0.01", "--passes", "3", "--sleep", "0.2", "--kernel-calls", "5",
                            "--kernel-length", "256", "--kernel-bytes", str(1 << 21),
                            "--json", str(out)])
    t = res["trials"]
    assert set(t) == {"reference", "back-to-back", "after-sleep", "kernel", "reference-end"}
    for name in ("reference", "back-to-back", "after-sleep", "reference-end"):
        assert len(t[name]["passes"]) == 3 and all(p["gbps"] > 0 for p in t[name]["passes"])
    assert t["after-sleep"]["passes"][0]["t_s"] >= 0.2  # timed from the write, across the idle time
    k = t["kernel"]["passes"]
    assert len(k) == 5 and [p["set"] for p in k] == [0, 1, 2, 3, 0]  # 4 sets of 512 KiB span 2 MiB
    assert [p["first_read"] for p in k] == [True] * 4 + [False]
    assert json.loads(out.read_text())["buffer_bytes"] == int(0.01 * 2**30) // 64 * 64
    with pytest.raises(SystemExit, match="--gib must be > 0"):
        fresh_pages.main(["--gib", "0"])


def test_the_cpu_chain_splits_a_step_into_kernels_and_the_waits_between_them(capsys):
    """``bench.cpu_chain``: two layers of attention then experts (the second layer's attention
    in two calls), times in seconds: the kernels, the waits from one kind to the other, the
    wait between two calls of one kind, the start and end -- summing to the step -- and a split
    step's overlap counted once."""
    from writescope.bench.cpu_chain import cpu_chain, print_cpu_chain
    att = [(0.001, 0.004), (0.010, 0.012), (0.0125, 0.013)]
    exp = [(0.005, 0.008), (0.014, 0.017)]
    c = cpu_chain(att, exp, 0.0, 0.020)
    assert c["attention_ms"] == pytest.approx(5.5) and c["experts_ms"] == pytest.approx(6.0)
    assert c["att_to_exp"] == 2 and c["att_to_exp_ms"] == pytest.approx(2.0)
    assert c["exp_to_att"] == 1 and c["exp_to_att_ms"] == pytest.approx(2.0)
    assert c["same_kind_gap_ms"] == pytest.approx(0.5) and c["overlap_ms"] == 0
    assert c["before_ms"] == pytest.approx(1.0) and c["after_ms"] == pytest.approx(3.0)
    parts = ("before_ms", "attention_ms", "experts_ms", "att_to_exp_ms", "exp_to_att_ms",
             "same_kind_gap_ms", "after_ms")
    assert sum(c[k] for k in parts) - c["overlap_ms"] == pytest.approx(c["step_ms"])
    print_cpu_chain(c)
    out = capsys.readouterr().out
    assert "attention kernels 5.5 (3 calls)" in out and "experts -> attention 2.0 (1, 2000 us" in out
    # a split step: one sub-batch's experts beside the other's attention
    s = cpu_chain([(0.0, 0.004)], [(0.002, 0.006)], 0.0, 0.006)
    assert s["overlap_ms"] == pytest.approx(2.0) and s["after_ms"] == pytest.approx(0.0)
    assert sum(s[k] for k in parts) - s["overlap_ms"] == pytest.approx(6.0)
    none = cpu_chain([], [], 0.0, 0.002)
    assert none["before_ms"] == pytest.approx(2.0)
    print_cpu_chain(none)
    assert capsys.readouterr().out == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_profile_lays_a_spilled_steps_cpu_kernels_in_one_chain(tiny_qwen3_moe, tmp_path,
                                                                    capsys):
    """On CUDA, ``--timeline`` of steps whose spilled KV the CPU attends (``--kv-policy cpu``)
    with the experts on the CPU: each layer's attention call (the attention's native queue)
    and expert call on one chain, with a wait from each kind to the other."""
    from writescope.bench import step_profile
    out = tmp_path / "p.json"
    assert step_profile.main(["--model", str(tiny_qwen3_moe), "--batch", "2", "--context",
                              "0.25k", "--warmup", "2", "--steps", "3", "--top", "3",
                              "--experts", "cpu", "--kv-policy", "cpu", "--num-gpu-blocks", "1",
                              "--prefill", "synthetic", "--timeline", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    c, layers = res["cpu_chain"], res["layers"]
    assert c["attention_calls"] >= layers and 1 <= c["expert_calls"] <= layers
    assert c["att_to_exp"] == c["expert_calls"] and c["exp_to_att"] == c["expert_calls"] - 1
    assert c["attention_ms"] > 0 and c["experts_ms"] > 0 and c["overlap_ms"] == 0
    assert c["before_ms"] > 0 and c["after_ms"] > 0
    assert "CPU chain (median of the unprofiled steps)" in capsys.readouterr().out


def test_the_link_split_gives_a_timed_steps_idle_link(capsys):
    """``bench.link_idle``: the link's busy time and its idle time before, between and after its
    copies on the device's clock, and the host's time outside the device's step; None for a
    step without the device's timing."""
    from writescope.bench.link_idle import link_split, median_split, print_link
    t = {"dev_first_copy_s": 0.001, "dev_last_copy_s": 0.030, "dev_end_s": 0.036,
         "pcie_s": 0.025, "pcie_bytes": 1.25e9}
    s = link_split(t, 0.040)
    assert s["busy_ms"] == pytest.approx(25.0) and s["before_ms"] == pytest.approx(1.0)
    assert s["between_ms"] == pytest.approx(4.0) and s["after_ms"] == pytest.approx(6.0)
    assert s["host_outside_ms"] == pytest.approx(4.0) and s["busy_gbps"] == pytest.approx(50.0)
    parts = ("busy_ms", "before_ms", "between_ms", "after_ms", "host_outside_ms")
    assert sum(s[k] for k in parts) == pytest.approx(40.0)  # the parts make up the wall step
    assert link_split({**t, "pcie_s": None}, 0.04) is None and link_split({}, 0.04) is None
    m = median_split([s, link_split({**t, "pcie_s": 0.020}, 0.040), s])
    assert m["busy_ms"] == pytest.approx(25.0) and m["between_ms"] == pytest.approx(4.0)
    print_link(m)
    assert "idle before its first copy 1.0 ms, between copies 4.0 ms" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_profile_times_a_streamed_steps_link(tiny_qwen3_moe, tmp_path, capsys,
                                                  monkeypatch):
    """On CUDA, a step whose spilled KV is streamed (``--kv-policy transfer``, one resident
    block) and timed on the device (every step here): the link's busy time and its idle time,
    which with the host's time outside the device's step make up the wall step."""
    from writescope.bench import step_profile
    monkeypatch.setenv("WRITESCOPE_TIMING_EVERY", "1")
    out = tmp_path / "p.json"
    assert step_profile.main(["--model", str(tiny_qwen3_moe), "--batch", "2", "--context",
                              "0.25k", "--warmup", "2", "--steps", "3", "--top", "3",
                              "--kv-policy", "transfer", "--num-gpu-blocks", "1",
                              "--prefill", "synthetic", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    link = res["link"]
    assert link["steps"] == 3 and link["busy_ms"] > 0 and link["link_gb"] > 0
    assert res["staging"]["plans"]["made"] >= 1 and res["staging"]["ahead"] is False
    assert res["staging"]["held_assigns"] == 0  # (transfer holds nothing)
    assert link["device_step_ms"] >= link["busy_ms"] + link["before_ms"]
    assert "link (timed steps' median): busy" in capsys.readouterr().out


def test_result_path_needs_cuda_and_sane_sizes():
    """``bench.result_path`` says what it needs rather than failing inside torch."""
    from writescope.bench import result_path
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA device"):
            result_path.main([])
    else:
        with pytest.raises(SystemExit, match="--busy-mb takes sizes in MB"):
            result_path.main(["--busy-mb", "lots"])
        with pytest.raises(SystemExit, match="must be > 0"):
            result_path.main(["--reps", "0"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_result_path_times_both_ways_alone_and_beside_a_busy_link(tmp_path):
    """On CUDA: a small result's transfer by copy engine and by in-place kernel, with the link
    idle and busy, each row's median within its maximum; JSON written."""
    from writescope.bench import result_path
    out = tmp_path / "r.json"
    res = result_path.main(["--busy-mb", "8", "--reps", "3", "--json", str(out)])
    assert [(r["busy_mb"], r["mode"]) for r in res["rows"]] == \
        [(0.0, "copy"), (0.0, "kernel"), (8.0, "copy"), (8.0, "kernel")]
    assert all(0 < r["median_us"] <= r["max_us"] for r in res["rows"])
    assert json.loads(out.read_text())["result_bytes"] == res["result_bytes"]
