"""Decode steps whose routed experts run on the CPU, split into two interleaved sub-batches
(``WRITESCOPE_PIPELINE_EXPERTS``, ``engine/graphs.pipelined_pieces``): the pieces' order, and on
the CPU (``WRITESCOPE_CUDA_GRAPHS=pieces``) the same tokens and log-probabilities as one batch.
The graphed form on CUDA is checked by the GPU tests at the end."""
from __future__ import annotations

import pytest
import torch

from test_parity import (GREEDY, PLACEMENTS, check, engine, finish_like, prompt_ids,
                         reference)
from writescope.engine import graphs
from writescope.kvcache.subbatches import expert_pipeline_mode


def _runs(model, prompts, mode: str, monkeypatch, **opts):
    """Greedy runs of ``prompts`` with the experts on the CPU and decode steps as pieces, one
    batch and then ``WRITESCOPE_PIPELINE_EXPERTS=mode``: the second's tokens and
    log-probabilities equal the first's. Returns the second's outputs and stats."""
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "0")
    want = engine(model, experts="cpu", **opts).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", mode)
    llm = engine(model, experts="cpu", **opts)
    got = llm.generate(prompts, GREEDY)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    return got, llm.stats()


@pytest.mark.parametrize("placement, n", [("all-G", 2), ("mixed", 3)])
def test_split_expert_steps_match_one_batch(all_tiny, placement, n, monkeypatch):
    """With the experts on the CPU and WRITESCOPE_PIPELINE_EXPERTS=all, decode steps of two or
    more sequences run split, also where attention runs through the hybrid side (on the CPU
    every step does) -- with no CPU attention ("all-G", split by sequences) and with it
    ("mixed") -- and every token and log-probability is the one-batch run's and
    transformers'."""
    prompts = [prompt_ids(320, 40 + 37 * i, seed=30 + i) for i in range(n)]
    got, s = _runs(all_tiny, prompts, "all", monkeypatch, **PLACEMENTS[placement])
    # the decode steps of all n sequences (not those beside another's prefill chunk)
    assert s["kv.pipelined_steps"] >= GREEDY.max_tokens * 3 // 4, s["kv.pipelined_steps"]
    check(got[0], *reference(str(all_tiny), tuple(prompts[0])))


def test_what_is_not_split(tiny_qwen3_moe, monkeypatch):
    """``auto`` (the default) and ``on`` split only steps whose sub-batches attend through
    resident buffers, none here (the CPU's hybrid side); one sequence is never split, even with
    ``all``; ``off`` splits nothing."""
    monkeypatch.delenv("WRITESCOPE_PIPELINE_EXPERTS", raising=False)
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    two = [prompt_ids(320, 40, seed=1), prompt_ids(320, 50, seed=2)]
    for mode, prompts in ((None, two), ("all", two[:1]), ("1", two), ("0", two)):
        if mode is not None:
            monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", mode)
        llm = engine(tiny_qwen3_moe, experts="cpu", **PLACEMENTS["all-G"])
        llm.generate(prompts, GREEDY)
        assert llm.stats()["kv.pipelined_steps"] == 0, mode


def test_the_engine_gives_the_step_form_chooser_its_prior(tiny_qwen3_moe, tiny_mixtral,
                                                          monkeypatch):
    """With routed experts on the CPU the runner asks the engine which form the planner predicts
    faster (the chooser's first incumbent, stepform.py), through a weak reference to the engine
    (test_engine_lifetime.py); without CPU experts it has no prior."""
    from pathlib import Path
    from writescope.core import ScheduledSeq, StepBatch
    h200 = Path(__file__).resolve().parent.parent / "bench" / "profiles" / "h200.json"
    monkeypatch.setenv("WRITESCOPE_PROFILE", str(h200))
    eng = engine(tiny_qwen3_moe, experts="cpu").engine
    for n, ctx in ((2, 100), (4, 400)):
        batch = StepBatch([ScheduledSeq(None, ctx, 1, True) for _ in range(n)])
        want = eng._split_experts_predicted_faster(batch)
        assert isinstance(want, bool) and eng.runner.form_prior(batch) is want
    assert engine(tiny_mixtral).engine.runner.form_prior is None


def test_split_expert_piece_order(tiny_deepseek_v2, monkeypatch):
    """Each sub-batch runs up to its next wait for the CPU: in a resident step (no CPU
    attention) the other sub-batch's layers run between a CPU layer's launch (``ffn``) and its
    wait (``moe``); layer 0 of the tiny DeepSeek is dense, so it is one ``ffn`` piece."""
    llm = engine(tiny_deepseek_v2, experts="cpu")
    model, cache = llm.engine.model, llm.engine.cache
    names = [p.name for p in graphs.pipelined_pieces(model, [2, 1], cache, resident=True,
                                                     split_experts=True)]
    a = ["0:embed", "0:pre0", "0:attn0", "0:post0", "0:ffn0", "0:pre1", "0:attn1", "0:post1",
         "0:ffn1"]
    assert names[:len(a)] == a
    assert names[len(a):2 * len(a)] == [k.replace("0:", "1:") for k in a]
    assert names[2 * len(a):2 * len(a) + 5] == ["0:moe1", "0:pre2", "0:attn2", "0:post2",
                                                "0:ffn2"]
    last = len(model.model.layers) - 1
    assert names[-4:] == [f"0:moe{last}", "0:norm", f"1:moe{last}", "1:norm"]
    assert sorted(names) == sorted(
        [p.name for g, c in ((0, 2), (1, 1)) for p in _one_group(model, cache, g, c)])
    waits = [p.name for p in graphs.pipelined_pieces(model, [2, 1], cache, split_experts=True)
             if p.waits]
    assert "0:finish0" in waits and "0:moe1" in waits and "0:moe0" not in waits
    # without split_experts the MoE block is one piece, as in one batch
    plain = [p.name for p in graphs.pipelined_pieces(model, [2, 1], cache)]
    assert "0:moe1" not in plain and "0:ffn1" in plain


def _one_group(model, cache, g, n):
    embed, norm = graphs._ends(model, g)
    body = [p for i, l in enumerate(model.model.layers)
            for p in graphs._layer_pieces(i, l, n, cache, g, True, True)]
    return [embed] + body + [norm]


def test_interleave_runs_each_list_up_to_its_next_wait():
    P = graphs.Piece
    mk = lambda g, names: [P(f"{g}:{k.strip('*')}", None, (), (), True, g, waits=k.endswith("*"))
                           for k in names]
    a = mk(0, ["a", "b*", "c", "d*", "e"])
    b = mk(1, ["x*", "y", "z*"])
    got = [p.name for p in graphs.interleave([a, b])]
    # a turn may begin with a waiting piece (the wait its list stopped before)
    assert got == ["0:a", "1:x", "1:y", "0:b", "0:c", "1:z", "0:d", "0:e"]
    assert [p.name for p in graphs.interleave([a])] == [p.name for p in a]


def test_expert_pipeline_mode(monkeypatch):
    for v, want in (("0", "off"), ("", "auto"), ("off", "off"), ("1", "on"), ("ON", "on"),
                    ("auto", "auto"), ("all", "all")):
        monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", v)
        assert expert_pipeline_mode() == want
    monkeypatch.delenv("WRITESCOPE_PIPELINE_EXPERTS")
    assert expert_pipeline_mode() == "auto"  # the default
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "sometimes")
    with pytest.raises(ValueError, match="WRITESCOPE_PIPELINE_EXPERTS"):
        expert_pipeline_mode()


RESIDENT_SPLIT_CODE = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from test_parity import GREEDY, PLACEMENTS, engine, prompt_ids
from writescope import SamplingParams
path = sys.argv[1]
prompts = [prompt_ids(320, n, seed=n) for n in (5, 40)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=GREEDY.logprobs)
out = {}
for split in ("0", "1", "auto"):
    os.environ["WRITESCOPE_PIPELINE_EXPERTS"] = split
    llm = engine(path, experts="cpu", **PLACEMENTS["all-G"])
    got = llm.generate(prompts, GREEDY)
    s = llm.stats()
    out[split] = {"tokens": [o.token_ids for o in got], "logprobs": [o.logprobs for o in got],
                  "resident_steps": s["kv.resident_steps"], "split": s["kv.pipelined_steps"],
                  "W": s["kv.bytes_written.W"], "forms": s.get("engine.step_forms")}
print(json.dumps(out))
"""


def test_split_resident_steps_match_one_batch(tiny_qwen3_moe):
    """Each sub-batch of a split step attends through resident buffers of its own
    (``cache.attend_resident`` with a group, the form a CUDA graph captures): run as pieces
    with Triton's CPU interpreter, the split resident steps give the one-batch resident run's
    tokens and log-probabilities, and write the same W bytes. ``auto`` probes both forms (the
    chooser, ``stepform.py``), with the same tokens."""
    from triton_interp import interpreted_json
    res = interpreted_json(RESIDENT_SPLIT_CODE, str(tiny_qwen3_moe),
                           env={"WRITESCOPE_CUDA_GRAPHS": "pieces",
                                "WRITESCOPE_RESIDENT_ATTENTION": "force"})
    one, split = res["0"], res["1"]
    assert one["split"] == 0 and one["resident_steps"] > 0, one
    assert split["split"] > 0 and split["resident_steps"] >= split["split"] // 2, split
    assert split["tokens"] == one["tokens"]
    for a, b in zip(split["logprobs"], one["logprobs"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert split["W"] == one["W"]
    auto = res["auto"]
    assert auto["tokens"] == one["tokens"]
    assert any(f["single_ms"] is not None and f["pipelined_ms"] is not None
               for f in auto["forms"].values()), auto["forms"]
    assert 0 < auto["split"] < split["split"], auto


def _eager_then_graphed(model, prompts, kw, monkeypatch):
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "0")
    want = engine(model, **kw).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "1")
    llm = engine(model, **kw)
    got = llm.generate(prompts, GREEDY)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    return llm.stats()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("placement", ["all-G", "mixed"])
def test_split_expert_steps_graphed_on_cuda(all_tiny, placement, monkeypatch):
    """On CUDA, split steps with CPU experts are captured and replayed: resident ones ("all-G",
    each sub-batch through its own buffers, the CPU expert calls graphed) and, with
    WRITESCOPE_PIPELINE_EXPERTS=all, hybrid ones ("mixed", attention eager); the tokens are
    eager one-batch decoding's."""
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "1" if placement == "all-G" else "all")
    prompts = [prompt_ids(320, n, seed=n) for n in (5, 20, 30)]
    s = _eager_then_graphed(all_tiny, prompts,
                            dict(device="cuda", experts="cpu", **PLACEMENTS[placement]),
                            monkeypatch)
    assert s["graphs.pipelined_steps"] > 0 and s["kv.pipelined_steps"] > 0, s
    if placement == "all-G":
        assert s["kv.resident_steps"] > 0, s
        assert s["graphs.cpu_expert_calls"] > 0, s


def test_a_split_step_whose_experts_fail_is_rolled_back(tiny_qwen3_moe, monkeypatch):
    """A CPU expert call that fails in one sub-batch of a split step (the other sub-batch's
    call of that layer already launched): the engine raises, the cache is as before the step,
    and the next steps finish the requests with the one-batch run's tokens."""
    monkeypatch.setenv("WRITESCOPE_CUDA_GRAPHS", "pieces")
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "0")
    prompts = [prompt_ids(320, n, seed=n) for n in (20, 70)]
    want = engine(tiny_qwen3_moe, experts="cpu", **PLACEMENTS["mixed"]).generate(prompts, GREEDY)
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "all")
    eng = engine(tiny_qwen3_moe, experts="cpu", **PLACEMENTS["mixed"]).engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    while eng.cache.counters["kv.pipelined_steps"] < 3:
        eng.step()
    live = eng.cache.live_blocks()
    from writescope.layers.moe import MoE
    real = MoE.finish
    calls = []

    def failing(self, call):
        calls.append(1)
        if len(calls) == 1:  # sub-batch 0's first wait; sub-batch 1's call is launched by now
            raise RuntimeError("injected: a CPU expert job failed")
        return real(self, call)
    monkeypatch.setattr(MoE, "finish", failing)
    with pytest.raises(RuntimeError, match="injected"):
        eng.step()
    assert eng.cache.live_blocks() == live
    finish_like(eng, want, logprob_tol=1e-5)
