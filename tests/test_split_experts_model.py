"""The roofline's model of a decode step with CPU experts split into two sub-batches
(``planner/roofline._split_experts_step``, ``WRITESCOPE_PIPELINE_EXPERTS``)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from test_planner import h200_like
from writescope.layers.expert_placement import cpu_layer_order
from writescope.models.config import ModelConfig
from writescope.planner import roofline as rl

QWEN = ModelConfig.from_hf("qwen3-30b-a3b")


def _flags(k: int) -> frozenset:
    return frozenset(cpu_layer_order(QWEN.moe_layers)[:k])


def test_the_split_step_is_the_longest_of_its_lines():
    """The GPU's work and the CPU's experts, each summed over both sub-batches timed at their
    own loads, each CPU layer's round trip once; the CPU's side adds one GPU segment of each
    sub-batch; plus the LM head."""
    prof = h200_like()
    flags = _flags(6)
    load = rl.StepLoad(5, 5 * 8192, 0.0, 0.0, 0.0)
    p = rl.predict_step(prof, QWEN, load, flags, pipelined=True)
    g = c = 0.0
    for b in (3, 2):  # the first sub-batch takes the odd sequence
        half = rl.StepLoad(b, b * 8192, 0.0, 0.0, 0.0)
        for i in range(QWEN.num_layers):
            lt = rl.layer_time(prof, QWEN, i, half, flags)
            g += lt.dense_s + lt.gpu_attn_s + (0.0 if i in flags else lt.expert_s)
            c += lt.cpu_attn_s + (lt.expert_s if i in flags else 0.0)
    c -= 6 * prof.cpu_roundtrip_s  # the second call's latency hides behind the other's work
    assert p.lines == pytest.approx((g, c + g / 7))
    head = QWEN.vocab_size * QWEN.hidden_size * rl.WEIGHT_BYTES / prof.weight_read_Bps
    assert p.step_s == pytest.approx(max(p.lines) + head)
    assert p.cpu_expert_s == pytest.approx(c)  # no CPU attention here: all of it experts
    # a one-batch step has no lines (the sum of its layers), nor does a split one of one
    # sequence, or one with every expert on the GPU
    assert rl.predict_step(prof, QWEN, load, flags).lines == ()
    assert rl.predict_step(prof, QWEN, rl.StepLoad(1, 8192, 0, 0, 0), flags,
                           pipelined=True).lines == ()
    assert rl.predict_step(prof, QWEN, load, frozenset(), pipelined=True).lines == ()


def test_splitting_pays_where_the_gpu_has_work_to_overlap():
    """A few CPU layers and long contexts: the GPU's work hides most of the CPU's, and the
    split step is predicted shorter. Every layer's experts on the CPU and short contexts: the
    GPU has almost nothing to overlap, and the halves read more distinct experts and pay two
    round trips: the split step is predicted longer."""
    prof = h200_like()
    long = rl.StepLoad(4, 4 * 65536, 0.0, 0.0, 0.0)
    few = _flags(6)
    one = rl.predict_step(prof, QWEN, long, few)
    split = rl.predict_step(prof, QWEN, long, few, pipelined=True)
    assert split.step_s < 0.85 * one.step_s, (split.step_s, one.step_s)
    short = rl.StepLoad(4, 4 * 1024, 0.0, 0.0, 0.0)
    every = _flags(len(QWEN.moe_layers))
    assert rl.predict_step(prof, QWEN, short, every, pipelined=True).step_s > \
        rl.predict_step(prof, QWEN, short, every).step_s
    # the halves' routed experts: more distinct experts in all than the whole batch's
    assert split.cpu_expert_s > one.cpu_expert_s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 16), ctx=st.integers(1, 1 << 17), k=st.integers(0, 48))
def test_auto_times_each_resident_step_in_its_faster_form(b, ctx, k):
    """``pipelined="auto"`` (``WRITESCOPE_PIPELINE_EXPERTS``'s default: the runner measures both
    forms and keeps the faster) predicts a step with all KV in HBM as the faster of one batch and
    two sub-batches; ``"on"`` as two sub-batches wherever the engine splits, like ``True``."""
    prof = h200_like()
    flags = _flags(k)
    load = rl.StepLoad(b, b * ctx, 0.0, 0.0, 0.0)
    one = rl.predict_step(prof, QWEN, load, flags)
    split = rl.predict_step(prof, QWEN, load, flags, pipelined=True)
    auto = rl.predict_step(prof, QWEN, load, flags, pipelined="auto")
    assert auto.step_s == min(one.step_s, split.step_s)
    assert auto.lines == (split.lines if split.step_s < one.step_s else ())
    assert rl.predict_step(prof, QWEN, load, flags, pipelined="on") == split
    if b < 2 or k == 0:  # nothing to split: one batch in every form
        assert split == one == auto


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(0, 10 ** 6), t=st.integers(0, 10 ** 6), res=st.integers(0, 10 ** 5),
       b=st.integers(2, 16), k=st.integers(1, 48), free=st.booleans(),
       form=st.sampled_from([True, "on", "auto"]))
def test_a_step_with_spilled_kv_is_planned_whole(c, t, res, b, k, free, form):
    """The engine splits only steps whose KV is all in HBM: with any KV spilled, the share and
    the step planned for a pipelined engine are the one-batch plan's."""
    if c + t == 0:
        return
    prof = h200_like()
    flags = _flags(k)
    split = rl.optimal_cpu_share(prof, QWEN, b, res, c, t, flags, free=free, pipelined=form)
    one = rl.optimal_cpu_share(prof, QWEN, b, res, c, t, flags, free=free)
    assert split.cpu_share == one.cpu_share
    assert split.prediction.step_s == one.prediction.step_s and not split.prediction.lines


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 10 ** 6), res=st.integers(0, 10 ** 5), b=st.integers(2, 16),
       form=st.sampled_from(["on", "auto"]))
def test_expert_forms_leave_cpu_attention_whole(c, res, b, form):
    """``"on"`` and ``"auto"`` describe the expert split alone: with every expert on the GPU a
    step whose CPU attends spilled KV is planned whole (the attention's split is
    ``WRITESCOPE_PIPELINE``'s, ``pipelined=True``)."""
    prof = h200_like()
    got = rl.optimal_cpu_share(prof, QWEN, b, res, 0, c, False, free=True, pipelined=form)
    one = rl.optimal_cpu_share(prof, QWEN, b, res, 0, c, False, free=True)
    assert got.cpu_share == one.cpu_share and got.prediction.step_s == one.prediction.step_s
    assert not any(lt.pipelined for lt in got.prediction.layers)


def test_expert_form_of_each_mode():
    assert [rl.expert_form(m) for m in ("on", "all", "auto", "off")] == ["on", "on", "auto", False]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(2, 8), ctx=st.sampled_from([4096, 8192, 16384, 32768, 65536]))
def test_the_auto_split_of_experts_is_no_slower_than_either_form(b, ctx):
    """``kv_cache_memory="auto"`` under ``WRITESCOPE_PIPELINE_EXPERTS=auto``: the split of the
    routed experts against KV is chosen with each step in its faster form, so its predicted step
    is at most the best of planning every step whole or every step split."""
    from writescope.planner.expert_split import best_split
    prof = h200_like()
    budget = 32 << 30
    kw = dict(min_kv_bytes=int(rl.kv_bytes_per_token_layer(QWEN) * QWEN.num_layers * ctx))
    got = {f: best_split(prof, QWEN, [ctx] * b, budget, pipelined=f, **kw)
           for f in (False, "on", "auto")}
    assert got["auto"]["step_s"] <= min(got[False]["step_s"], got["on"]["step_s"]) * (1 + 1e-12)


def test_plan_times_split_steps_when_asked(tmp_path, capsys, monkeypatch):
    """``writescope plan --pipeline-experts on`` (by default WRITESCOPE_PIPELINE_EXPERTS's
    setting, ``auto``: each step in its faster form) plans every policy's steps and the splits
    of experts against KV with the split model; it says so in its header and JSON."""
    import json

    from writescope import cli
    prof = tmp_path / "p.json"
    h200_like().save(prof)
    out = {}
    base = ["plan", "--model", "qwen3-30b-a3b", "--profile", str(prof), "--batch", "4",
            "--context-lengths", "8k,64k", "--experts", "auto"]
    monkeypatch.delenv("WRITESCOPE_PIPELINE_EXPERTS", raising=False)
    for name, extra in (("one", ["--pipeline-experts", "off"]),
                        ("split", ["--pipeline-experts", "on"]), ("default", [])):
        assert cli.main(base + extra + ["--json", str(tmp_path / f"{name}.json")]) == 0
        out[name] = (capsys.readouterr().out, json.loads((tmp_path / f"{name}.json").read_text()))
    monkeypatch.setenv("WRITESCOPE_PIPELINE_EXPERTS", "1")
    assert cli.main(base + ["--json", str(tmp_path / "env.json")]) == 0
    capsys.readouterr()
    env = json.loads((tmp_path / "env.json").read_text())
    assert "two sub-batches" in out["split"][0] and "two sub-batches" not in out["one"][0]
    assert "the faster of one batch and two sub-batches" in out["default"][0]
    assert out["split"][1]["meta"]["pipeline_experts"] == env["meta"]["pipeline_experts"] == "on"
    assert out["one"][1]["meta"]["pipeline_experts"] == "off"
    assert out["default"][1]["meta"]["pipeline_experts"] == "auto"
    # the default's step at each length is the faster of the two forms' (the same split here)
    for a, o, sp in zip(out["default"][1]["writescope"], out["one"][1]["writescope"],
                        out["split"][1]["writescope"]):
        assert a["predicted_step_s"] == pytest.approx(min(o["predicted_step_s"],
                                                          sp["predicted_step_s"]), rel=1e-9)
    # the same placement, each step timed in its own form
    assert out["split"][1]["meta"]["experts"] == out["one"][1]["meta"]["experts"]
    flags = frozenset(cpu_layer_order(QWEN.moe_layers)[:int(
        out["one"][1]["meta"]["experts"].split()[2])])
    g = out["one"][1]["meta"]["g_region_tokens"]
    res = sum(rl.resident_tokens([8192] * 4, g))
    want = rl.target_share(h200_like(), QWEN, 4, res, 4 * 8192 - res, flags,
                           pipelined=True).prediction.step_s
    got = out["split"][1]["writescope"][0]["predicted_step_s"]
    assert got == pytest.approx(want, rel=1e-9)
    assert env["writescope"] == out["split"][1]["writescope"]
    assert out["split"][1]["expert_splits"] != out["one"][1]["expert_splits"]


def test_the_step_form_choosers_prior_is_the_faster_predicted_form():
    """The engine's prior for the step-form chooser (``LLMEngine._split_experts_predicted_faster``):
    the split form where the roofline predicts it faster at the batch's context, all in HBM --
    DeepSeek-V2-Lite 4 x 32K with six layers' experts on the CPU (measured 27.0 against 28.6 ms
    on an H200 host, bench/results/2026-12-06-h200) -- one batch where it predicts that faster
    (Qwen3-30B-A3B 4 x 8K with every expert on the CPU: its GPU has little to overlap), and no
    prior without a GPU in the profile."""
    from types import SimpleNamespace as NS

    from writescope.engine.engine import LLMEngine
    import dataclasses
    prof = h200_like(graph_launch_s=1e-6)  # decode steps replayed as CUDA graphs, as split ones are
    ds = ModelConfig.from_hf("deepseek-v2-lite")
    cases = ((ds, 32768, frozenset(cpu_layer_order(ds.moe_layers)[:6]), True),
             (QWEN, 8192, frozenset(QWEN.moe_layers), False))
    for cfg, ctx, layers, want in cases:
        flags = [i in layers for i in range(cfg.num_layers)]
        batch = NS(seqs=[NS(start=ctx - 1, num_new=1)] * 4)
        got = LLMEngine._split_experts_predicted_faster(
            NS(profile=prof, config=cfg, cpu_expert_layers=flags), batch)
        load = rl.StepLoad(4, 4.0 * ctx, 0.0, 0.0, 0.0)
        split, whole = (rl.predict_step(prof, cfg, load, layers, pipelined=p).step_s
                        for p in (True, False))
        assert got is want and (split < whole) is want, (cfg.model_type, split, whole)
    cpu_only = dataclasses.replace(prof, h2d_pinned_Bps=None, hbm_Bps=None)
    assert LLMEngine._split_experts_predicted_faster(
        NS(profile=cpu_only, config=QWEN, cpu_expert_layers=[True] * 48), batch) is None
