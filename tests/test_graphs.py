"""Piecewise decode (engine/graphs.py): the piece list equals the model's forward pass (checked on
the CPU through ``WRITESCOPE_CUDA_GRAPHS=pieces``); on CUDA, captured graphs give the same tokens
as eager decoding."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from test_parity import (GREEDY, PLACEMENTS, check, engine, generate_checked, prompt_ids,
                         reference)
from writescope.engine import graphs
from writescope.layers import cpu_experts_graph


@pytest.mark.parametrize("placement", ["mixed", "all-C"])
def test_pieces_match_transformers(all_tiny, placement, monkeypatch):
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    llm = generate_checked(all_tiny, **PLACEMENTS[placement])
    g = llm.engine.runner.graphs
    assert g is not None and g.mode == "pieces"
    assert not g.plans  # pieces mode never captures


def test_pieces_with_cpu_experts_and_batches(tiny_deepseek_v2, monkeypatch):
    prompts = [prompt_ids(320, n, seed=n) for n in (5, 40, 90)]
    want = engine(tiny_deepseek_v2, experts="cpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    got = engine(tiny_deepseek_v2, experts="cpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    for a, b in zip(got, want):  # padded rows change the GEMM shapes: last-bit differences
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_segments_split_at_attention_and_host_bound_experts(tiny_deepseek_v2):
    llm = engine(tiny_deepseek_v2, experts="cpu")
    model = llm.engine.model
    segs = graphs.segments(graphs.decode_pieces(model, 4, llm.engine.cache))
    names = [[p.name for p in s.pieces] for s in segs]
    # layer 0 is dense (graph-safe); layers 1, 2 run their experts on the CPU (eager)
    assert names[0] == ["embed", "pre0"] and names[1] == ["attn0"]
    assert names[2] == ["post0", "ffn0", "pre1"]
    assert ["ffn1"] in names and ["ffn2"] in names
    assert [s.graphable for s in segs] == [i % 2 == 0 for i in range(len(segs))]
    assert segs[2].inputs == ["x", "o_kv", "l_kv", "q", "rec", "cos", "sin"]
    # the MLP's output (dx) is added by the next layer's pre, with its norm
    assert segs[2].outputs == ["x", "h", "dx", "q", "rec"]


def test_graph_safe_runs_are_cut_every_max_layers(tiny_qwen3_moe, monkeypatch):
    """A resident step (every piece graph-safe) is one segment, or one per ``max_layers`` layers
    cut before a layer's first piece; WRITESCOPE_GRAPH_SEGMENT_LAYERS sets the default."""
    llm = engine(tiny_qwen3_moe)
    model = llm.engine.model
    pieces = graphs.decode_pieces(model, 4, llm.engine.cache, resident=True)
    # as on CUDA, where the experts' pieces are graph-safe too (the CPU's grouped path is not)
    pieces = [dataclasses.replace(p, graphable=True) for p in pieces]
    n_layers = len(model.model.layers)
    assert len(graphs.segments(pieces, 0)) == 1
    one = graphs.segments(pieces, 1)
    assert [p.name for p in one[0].pieces] == ["embed", "pre0", "attn0", "post0", "ffn0"]
    assert len(one) == n_layers and all(s.graphable for s in one)
    assert [s.pieces[0].name for s in one[1:]] == [f"pre{i}" for i in range(1, n_layers)]
    assert one[-1].pieces[-1].name == "norm"
    assert sum(len(s.pieces) for s in one) == len(pieces)
    two = graphs.segments(pieces, 2)
    assert len(two) == (n_layers + 1) // 2
    # eager pieces still break runs, and a cut never lands inside an eager run
    hybrid = graphs.segments(graphs.decode_pieces(model, 4, llm.engine.cache), 1)
    assert [s.graphable for s in hybrid] == [i % 2 == 0 for i in range(len(hybrid))]
    monkeypatch.setenv("WRITESCOPE_GRAPH_SEGMENT_LAYERS", "1")
    assert len(graphs.segments(pieces)) == n_layers
    monkeypatch.setenv("WRITESCOPE_GRAPH_SEGMENT_LAYERS", "two")
    with pytest.raises(ValueError, match="WRITESCOPE_GRAPH_SEGMENT_LAYERS"):
        graphs.segments(pieces)


def test_step_sizes_are_bucketed():
    assert [graphs.bucket(n) for n in (1, 2, 3, 5, 9, 13, 17, 33, 64)] == \
        [1, 2, 4, 8, 12, 16, 24, 48, 64]
    with pytest.raises(ValueError):
        graphs.bucket(65)


@pytest.mark.parametrize("n", [3, 5, 7])
def test_padded_pieces_match_the_model(tiny_qwen3_moe, n, monkeypatch):
    """Batches that are not a captured size run padded: same tokens and logprobs as eager."""
    prompts = [prompt_ids(320, 10 + 13 * i, seed=i) for i in range(n)]
    want = engine(tiny_qwen3_moe, **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    got = engine(tiny_qwen3_moe, **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def split_against_one_batch(model, prompts, mode: str, monkeypatch):
    """Greedy runs of ``prompts`` with decode steps as pieces, WRITESCOPE_PIPELINE=0 and then
    ``mode``: every token and log-probability of the second equals the first's. Returns the
    second run's outputs and its engine's stats."""
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "0")
    want = engine(model, **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_PIPELINE", mode)
    llm = engine(model, **PLACEMENTS["mixed"])
    got = llm.generate(prompts, GREEDY)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    return got, llm.stats()


@pytest.mark.parametrize("n", [2, 3, 5])
def test_pipelined_pieces_match_transformers(all_tiny, n, monkeypatch):
    """Decode steps with CPU attention run as two interleaved sub-batches (pipelined_pieces):
    every sequence's greedy tokens and log-probabilities equal transformers' and the
    one-batch run's, and the steps really were split."""
    prompts = [prompt_ids(320, 40 + 37 * i, seed=10 + i) for i in range(n)]
    got, s = split_against_one_batch(all_tiny, prompts, "1", monkeypatch)
    assert s["kv.pipelined_steps"] > 0 and s["graphs.pipelined_steps"] == 0  # pieces: no replay
    check(got[0], *reference(str(all_tiny), tuple(prompts[0])))


def test_auto_step_form_tries_both_forms_and_keeps_the_tokens(tiny_qwen3_moe, monkeypatch):
    """WRITESCOPE_PIPELINE=auto: the decode steps of one batch size run in both forms while the
    chooser probes them (stepform.py), the engine's stats say what it chose, and every token and
    log-probability is the one-batch run's."""
    prompts = [prompt_ids(320, 40 + 37 * i, seed=20 + i) for i in range(3)]
    _, s = split_against_one_batch(tiny_qwen3_moe, prompts, "auto", monkeypatch)
    keys = s["engine.step_forms"]  # decode steps of 1, 2, then 3 sequences, whose context
    assert "3 seqs, 256+ tokens" in keys, keys  # crossed 256 tokens
    # the first key of three sequences probed both forms; the one past 256 tokens started from
    # its choice (the related key, at half the context) instead of probing again
    forms = keys["3 seqs, 128+ tokens"]
    assert forms["single_ms"] is not None and forms["pipelined_ms"] is not None, forms
    later = keys["3 seqs, 256+ tokens"]
    assert later["inherited"] and later["choice"] == forms["choice"], keys
    assert not any(k.startswith("1 seqs") for k in keys), keys  # one sequence: never split
    assert 0 < s["kv.pipelined_steps"] < GREEDY.max_tokens


def test_pipelined_piece_order(tiny_qwen3_moe):
    """Sub-batch B's dense work sits between A's launch and A's finish of each layer."""
    llm = engine(tiny_qwen3_moe)
    model = llm.engine.model
    names = [p.name for p in graphs.pipelined_pieces(model, [2, 2], llm.engine.cache)]
    assert names[:6] == ["0:embed", "0:pre0", "0:launch0", "1:embed", "1:pre0", "1:launch0"]
    assert names[6:11] == ["0:finish0", "0:post0", "0:ffn0", "0:pre1", "0:launch1"]
    assert names[11:16] == ["1:finish0", "1:post0", "1:ffn0", "1:pre1", "1:launch1"]
    last = len(model.model.layers) - 1
    assert names[-8:] == [f"0:finish{last}", f"0:post{last}", f"0:ffn{last}", "0:norm",
                          f"1:finish{last}", f"1:post{last}", f"1:ffn{last}", "1:norm"]
    segs = graphs.segments(graphs.pipelined_pieces(model, [2, 2], llm.engine.cache))
    assert all(len({p.group for p in s.pieces}) == 1 for s in segs)


def test_mode_switch(monkeypatch):
    for v, m in (("0", "off"), ("off", "off"), ("pieces", "pieces"), ("1", "on")):
        monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", v)
        assert graphs.mode() == m


def eager_then_graphed(model, prompts, kw: dict, monkeypatch):
    """Greedy runs with CUDA graphs off, then on: the second run's outputs (every token equal to
    the first's, log-probabilities within 1e-4) and its engine's stats, whose graphs were on."""
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "0")
    want = engine(model, **kw).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "1")
    llm = engine(model, **kw)
    got = llm.generate(prompts, GREEDY)
    s = llm.stats()
    assert s["graphs.mode"] == "on", s["graphs.mode"]
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    return got, s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("experts", ["gpu", "cpu"])
def test_cuda_graphs_match_eager(all_tiny, experts, monkeypatch):
    prompts = [prompt_ids(320, n, seed=n) for n in (3, 70, 150)]
    kw = dict(device="cuda", experts=experts, **PLACEMENTS["mixed"])
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "1")  # graphs of the split decode step too
    _, s = eager_then_graphed(all_tiny, prompts, kw, monkeypatch)
    assert s["graphs.captured_sizes"] >= 1 and s["graphs.replayed_steps"] > 0
    if experts == "gpu":  # steps with CPU attention replayed as two interleaved sub-batches
        assert s["graphs.pipelined_steps"] > 0 and s["kv.pipelined_steps"] > 0
    generate_checked(all_tiny, **kw)  # and against transformers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_enforce_eager_on_cuda(all_tiny):
    """vLLM's enforce_eager: this engine replays no decode step as a CUDA graph (another engine
    in the same process still does), plans with eager launches, and generates transformers'
    tokens."""
    kw = dict(device="cuda", **PLACEMENTS["all-G"])
    eager = generate_checked(all_tiny, enforce_eager=True, **kw)
    graphed = generate_checked(all_tiny, **kw)
    s, g = eager.stats(), graphed.stats()
    assert s["graphs.mode"] == "off" and s["graphs.replayed_steps"] == 0, s
    assert s["graphs.captured_sizes"] == 0, s
    assert g["graphs.replayed_steps"] > 0, g
    assert eager.engine.profile.graph_launch_s is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_step_form_with_cuda_graphs(tiny_qwen3_moe, monkeypatch):
    """WRITESCOPE_PIPELINE=auto on CUDA: both forms' decode steps are captured and replayed,
    the chooser times both, and the tokens are the eager one-batch run's."""
    prompts = [prompt_ids(320, n, seed=n) for n in (70, 150, 90)]
    kw = dict(device="cuda", experts="gpu", **PLACEMENTS["mixed"])
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "0")
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "0")
    want = engine(tiny_qwen3_moe, **kw).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "auto")
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "1")
    llm = engine(tiny_qwen3_moe, **kw)
    got = llm.generate(prompts, GREEDY)
    s = llm.stats()
    piped = s["graphs.pipelined_steps"]
    assert piped > 0 and s["graphs.replayed_steps"] > piped  # both forms replayed
    timed = [f for k, f in s["engine.step_forms"].items() if k.startswith("3 seqs")]
    assert any(f["single_ms"] and f["pipelined_ms"] for f in timed), s["engine.step_forms"]
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4



RESIDENT_CODE = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
path, placement = sys.argv[1], sys.argv[2]
if placement == "all-G":
    opts, lens = PLACEMENTS["all-G"], (5, 40, 90)
else:  # G fills up during the decode: later blocks go to T
    opts, lens = dict(kv_policy="transfer", num_gpu_blocks=4), (5, 20, 30)
prompts = [prompt_ids(320, n, seed=n) for n in lens]
out = {}
for mode in ("0", "force"):
    os.environ["WRITESCOPE_RESIDENT_ATTENTION"] = mode
    llm = engine(path, **opts)
    got = llm.generate(prompts, GREEDY)
    s = llm.stats()
    out[mode] = {"tokens": [o.token_ids for o in got], "logprobs": [o.logprobs for o in got],
                 "resident_steps": s["kv.resident_steps"], "steps": s["kv.steps"],
                 "W": s["kv.bytes_written.W"], "G": s["kv.bytes_written.G"],
                 "T": s["kv.bytes_written.T"], "sealed": s["kv.blocks_sealed_from_w"],
                 "token_bytes": llm.engine.cache.spec.token_bytes()}
print(json.dumps(out))
"""


@pytest.mark.parametrize("placement", ["all-G", "G-then-T"])
def test_resident_steps_match_the_hybrid_path(tiny_qwen3_moe, placement):
    """Decode steps whose cached KV is all on the GPU attend through fixed buffers
    (attention/resident.py, the form a CUDA graph captures): run as pieces with Triton's CPU
    interpreter, every token and log-probability equals the hybrid path's, the same W bytes
    are written (a resident step writes the token that completes a block to its W slot too,
    then copies the slot to the block's home in G), and such steps ran: in "all-G" every step
    but the prompts' three, those completing blocks included; in "G-then-T" only until G is
    full."""
    from triton_interp import interpreted_json
    res = interpreted_json(RESIDENT_CODE, str(tiny_qwen3_moe), placement,
                           env={"WRITESCOPE_CUDA_GRAPHS": "pieces"})
    off, on = res["0"], res["force"]
    assert off["resident_steps"] == 0
    assert on["resident_steps"] > 0
    assert off["sealed"] == 0 and on["sealed"] > 0, on
    if placement == "all-G":  # every decode step
        assert on["steps"] - on["resident_steps"] == 3, on
    else:
        assert on["resident_steps"] < on["steps"] // 2, on
    assert on["tokens"] == off["tokens"]
    for a, b in zip(on["logprobs"], off["logprobs"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert on["W"] == off["W"] + on["sealed"] * on["token_bytes"], (on, off)
    assert (on["G"], on["T"]) == (off["G"], off["T"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("experts", ["gpu", "cpu"])
def test_resident_steps_are_captured_whole(all_tiny, experts, monkeypatch):
    """On CUDA, decode steps whose cached KV is all on the GPU are captured with their attention
    (resident buffers) and replayed; when G fills up the steps go back to the hybrid path. With
    the experts on the CPU (their calls eager, the default) no step is resident
    (graphs.resident_rows); with them graphed (by default in resident steps,
    WRITESCOPE_CPU_EXPERTS_GRAPHED) they are resident like the rest. The tokens are the eager
    run's and transformers'."""
    lens = (5, 20, 30)
    prompts = [prompt_ids(320, n, seed=n) for n in lens]
    for opts in (PLACEMENTS["all-G"], dict(kv_policy="transfer", num_gpu_blocks=4)):
        kw = dict(device="cuda", experts=experts, **opts)
        _, s = eager_then_graphed(all_tiny, prompts, kw, monkeypatch)
        if experts == "cpu" and not cpu_experts_graph.enabled():
            assert s["kv.resident_steps"] == 0 and s["graphs.replayed_steps"] > 0, s
            assert s["graphs.cpu_expert_calls"] == 0, s
        else:
            assert s["graphs.resident_steps"] > 0, s
            assert s["kv.resident_steps"] >= s["graphs.resident_steps"], s
        if opts is not PLACEMENTS["all-G"] and experts == "gpu":
            assert s["kv.resident_steps"] < s["kv.steps"] // 2, s
    generate_checked(all_tiny, device="cuda", experts=experts, **PLACEMENTS["all-G"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_cpu_expert_calls_match_eager(all_tiny, monkeypatch):
    """WRITESCOPE_CPU_EXPERTS_GRAPHED=1: the graphs hold the CPU expert calls' device halves
    (layers/cpu_experts_graph.py), so steps with all KV on the GPU are resident (one graph) and
    the others break only at attention; every replay queues its layers' kernels. The tokens are
    the eager run's and transformers'. (The first version never captured on the H200,
    2026-12-03d call 4; this one passed there, 2026-12-03e call 1.)"""
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", "1")
    prompts = [prompt_ids(320, n, seed=n) for n in (5, 20, 30)]
    for opts in (PLACEMENTS["all-G"], dict(kv_policy="transfer", num_gpu_blocks=4)):
        kw = dict(device="cuda", experts="cpu", **opts)
        _, s = eager_then_graphed(all_tiny, prompts, kw, monkeypatch)
        assert s["graphs.cpu_expert_calls"] >= s["graphs.replayed_steps"] > 0, s
        if opts is PLACEMENTS["all-G"]:
            assert s["graphs.resident_steps"] > 0, s
    generate_checked(all_tiny, device="cuda", experts="cpu", **PLACEMENTS["all-G"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("experts", ["gpu", "cpu"])
def test_resident_steps_cut_into_several_graphs(all_tiny, experts, monkeypatch):
    """WRITESCOPE_GRAPH_SEGMENT_LAYERS=1: a resident step replays one graph per layer (the
    next launched while the device runs the last); with the experts on the CPU their calls are
    graphed and each graph's host halves are queued before its replay. Same tokens as eager."""
    monkeypatch.setenv("WRITESCOPE_GRAPH_SEGMENT_LAYERS", "1")
    if experts == "cpu":
        monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", "1")
    prompts = [prompt_ids(320, n, seed=n) for n in (5, 20, 30)]
    kw = dict(device="cuda", experts=experts, **PLACEMENTS["all-G"])
    _, s = eager_then_graphed(all_tiny, prompts, kw, monkeypatch)
    assert s["graphs.resident_steps"] > 0, s
    assert s["graphs.segments"] >= 2 * s["graphs.captured_sizes"], s
    if experts == "cpu":
        assert s["graphs.cpu_expert_calls"] >= s["graphs.resident_steps"], s


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resident_steps_around_eager_cpu_expert_calls(all_tiny, monkeypatch):
    """WRITESCOPE_RESIDENT_ATTENTION=force with the CPU expert calls eager: each layer's
    resident attention is captured in the graph between two expert calls. Same tokens as eager
    steps. (These diverged on the H200 in the twenty-eighth session; the likely cause, found in
    the thirtieth: each capture's warm-up computed the step's token from an earlier graph's
    output buffers -- the rotary tables -- which hold nothing at capture time, and wrote it into
    the KV buffers.)"""
    monkeypatch.setenv("WRITESCOPE_RESIDENT_ATTENTION", "force")
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", "0")
    prompts = [prompt_ids(320, n, seed=n) for n in (5, 20, 30)]
    kw = dict(device="cuda", experts="cpu", **PLACEMENTS["all-G"])
    _, s = eager_then_graphed(all_tiny, prompts, kw, monkeypatch)
    assert s["graphs.resident_steps"] > 0 and s["graphs.cpu_expert_calls"] == 0, s


@pytest.mark.parametrize("value,want", [(None, "auto"), ("auto", "auto"), ("1", "on"),
                                        ("on", "on"), ("0", "off"), ("off", "off")])
def test_graphed_cpu_expert_calls_mode(value, want, monkeypatch):
    """WRITESCOPE_CPU_EXPERTS_GRAPHED: auto (the default) graphs the calls in resident steps
    only, 1 in every graphed step, 0 never; anything else is an error (at the engine's start)."""
    if value is None:
        monkeypatch.delenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", raising=False)
    else:
        monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", value)
    assert cpu_experts_graph.mode() == want
    assert cpu_experts_graph.enabled(resident=True) == (want != "off")
    assert cpu_experts_graph.enabled(resident=False) == (want == "on")
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", "sometimes")
    with pytest.raises(ValueError, match="WRITESCOPE_CPU_EXPERTS_GRAPHED"):
        cpu_experts_graph.mode()


def test_bad_graphed_cpu_expert_calls_setting_fails_at_start(tiny_qwen3_moe, monkeypatch):
    monkeypatch.setenv("WRITESCOPE_CPU_EXPERTS_GRAPHED", "sometimes")
    with pytest.raises(ValueError, match="must be auto, 1 or 0"):
        engine(tiny_qwen3_moe)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("experts", ["gpu", "cpu"])
def test_graphs_are_captured_again_after_every_graph_was_dropped(tiny_deepseek_v2, experts,
                                                                 monkeypatch):
    """Batch 1 with all KV in G: every decode step is resident, block-completing ones too, so a
    longer request whose blocks outgrow the resident buffers drops every graph of the size.
    The next capture starts a memory pool of its own: asked for the released one, the
    allocator asserted (``use_count > 0``) and the engine ran eagerly from then on (sixty-fourth
    session, DeepSeek-V2-Lite 1 x 8K after a 1K warm-up). The tokens are the eager engine's."""
    import warnings
    prompts = [prompt_ids(320, n, seed=n) for n in (20, 400)]
    kw = dict(device="cuda", experts=experts, **PLACEMENTS["all-G"])
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "0")
    want = [engine(tiny_deepseek_v2, **kw).generate([p], GREEDY)[0] for p in prompts]
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "1")
    llm = engine(tiny_deepseek_v2, **kw)
    g = llm.engine.runner.graphs
    replayed = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="CUDA graph capture", category=RuntimeWarning)
        got = []
        for p in prompts:
            got.append(llm.generate([p], GREEDY)[0])
            replayed.append(llm.stats()["graphs.resident_steps"])
    assert g.disabled_reason is None
    assert replayed[0] > 0 and replayed[1] > replayed[0], replayed
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
