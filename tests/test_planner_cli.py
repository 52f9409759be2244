"""``writescope plan`` and ``writescope calibrate``, and finding a profile."""
import json
import os

import pytest

from writescope import cli
from writescope.models.config import ModelConfig
from writescope.planner import calibrate as cal
from writescope.planner import profile as prof_mod
from writescope.planner import roofline as rl
from writescope.planner.profile import HardwareProfile, load_or_calibrate

from test_planner import h200_like, tiny_cfg

POLICIES = ("transfer", "cpu", "static", "writescope")


@pytest.fixture
def profile_file(tmp_path):
    p = tmp_path / "h200-like.json"
    h200_like().save(p)
    return p


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_plan_json_and_plot(tmp_path, profile_file, model, capsys):
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    rc = cli.main(["plan", "--model", model, "--profile", str(profile_file), "--batch", "16",
                   "--context-lengths", "1k,8k,32k,128k", "--experts", "cpu",
                   "--vram-budget", "32GiB", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    doc = json.loads(out.read_text())
    for pol in POLICIES:
        rows = doc[pol]
        assert [r["context_length"] for r in rows] == [1024, 8192, 32768, 131072]
        for r in rows:
            assert 0.0 <= r["cpu_share"] <= 1.0 and r["predicted_step_s"] > 0
    assert [r["cpu_share"] for r in doc["transfer"]] == [0.0] * 4
    ws = [r["cpu_share"] for r in doc["writescope"]]
    assert ws == sorted(ws)
    for i, b in enumerate(doc["roofline_bound"]):
        assert b["context_length"] == doc["writescope"][i]["context_length"]
        assert b["step_s"] <= min(doc[p][i]["predicted_step_s"] for p in POLICIES) * (1 + 1e-9)
    assert doc["meta"]["experts"] == "cpu" and doc["meta"]["batch"] == 16
    assert png.stat().st_size > 10_000
    text = capsys.readouterr().out
    assert "writescope" in text and "128k" in text


def test_plan_says_when_its_profile_has_no_gpu(tmp_path, capsys):
    """A machine without a GPU plans every kernel on its CPU: plan says so and how to plan for
    a GPU machine; a GPU machine's profile gets no such note."""
    import dataclasses
    cpu_only = tmp_path / "cpu.json"
    dataclasses.replace(h200_like(), hbm_Bps=None, h2d_pinned_Bps=None, h2d_pinned_block_Bps=None,
                        h2d_pageable_Bps=None, d2h_pinned_Bps=None, concurrent_h2d_Bps=None,
                        concurrent_cpu_read_Bps=None).save(cpu_only)
    gpu = tmp_path / "gpu.json"
    h200_like().save(gpu)
    for path, noted in ((cpu_only, True), (gpu, False)):
        assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--profile", str(path),
                         "--context-lengths", "1k", "--experts", "cpu"]) == 0
        assert ("has no GPU" in capsys.readouterr().err) is noted


def test_plan_static_share_at_the_longest_context_and_the_best_other_column(profile_file, tmp_path,
                                                                          capsys):
    """``--static-share longest`` fixes static at writescope's target for the longest length
    given (as ``writescope bench`` does), so the two agree there; the table gives writescope's
    predicted speedup over the fastest other policy; a share outside [0, 1] is refused."""
    out = tmp_path / "p.json"
    assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--profile", str(profile_file),
                     "--batch", "8", "--context-lengths", "32k,128k", "--experts", "cpu",
                     "--vram-budget", "32GiB", "--static-share", "longest",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["static_share_from"].startswith("writescope's target share at 131072")
    assert doc["static"][-1]["cpu_share"] == doc["writescope"][-1]["cpu_share"]
    text = capsys.readouterr().out
    assert "best other" in text and text.rstrip().endswith("1.000x")
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "qwen3-30b-a3b", "--static-share", "1.5",
                  "--profile", str(profile_file)])
    assert "a CPU share is in [0, 1]" in capsys.readouterr().err


def test_plan_takes_the_default_model_by_its_served_name(profile_file, default_model_dir,
                                                         monkeypatch, capsys):
    from writescope.models import default
    monkeypatch.setattr(default, "default_model_path", lambda: default_model_dir)
    rc = cli.main(["plan", "--model", "writescope-default", "--profile", str(profile_file),
                   "--context-lengths", "1k"])
    assert rc == 0, capsys.readouterr().err
    assert "writescope-default" in capsys.readouterr().out


def test_calibrate_takes_the_default_model_by_its_served_name(tmp_path, monkeypatch):
    from writescope.models import default
    monkeypatch.setattr(default, "default_model_path", lambda: tmp_path / "default-moe")
    asked = []

    def fake(quick, models, threads, command):  # the wiring only: no probes
        asked.append(models)
        return h200_like()
    monkeypatch.setattr(cal, "calibrate", fake)
    out = tmp_path / "p.json"
    assert cli.main(["calibrate", "--quick", "--out", str(out), "--model", "writescope-default",
                     "--model", "qwen3-30b-a3b"]) == 0
    assert asked == [[str(tmp_path / "default-moe"), "qwen3-30b-a3b"]] and out.exists()


def test_plan_rejects_weights_that_do_not_fit(profile_file, capsys):
    rc = cli.main(["plan", "--model", "mixtral-8x7b", "--profile", str(profile_file),
                   "--experts", "gpu", "--vram-budget", "32GiB"])
    assert rc == 1
    assert "do not fit" in capsys.readouterr().err


def test_plan_auto_experts(profile_file, tmp_path):
    out = tmp_path / "p.json"
    assert cli.main(["plan", "--model", "mixtral-8x7b", "--profile", str(profile_file),
                     "--vram-budget", "200GiB", "--json", str(out), "--context-lengths", "4k"]) == 0
    assert json.loads(out.read_text())["meta"]["experts"] == "gpu"
    assert cli.main(["plan", "--model", "mixtral-8x7b", "--profile", str(profile_file),
                     "--vram-budget", "32GiB", "--json", str(out), "--context-lengths", "4k"]) == 0
    # the engine's choice for the budget: as many MoE layers' experts on the GPU as fit beside
    # the KV and the activations it measures (estimated: planner/activations.py, with the
    # upload buffer of CPU experts)
    import torch
    from writescope.layers.expert_placement import choose_expert_layers
    from writescope.planner.expert_split import estimated_margin
    cfg = ModelConfig.from_hf("mixtral-8x7b")
    flags = choose_expert_layers(cfg, "auto", 32 * 2**30, cfg.kv_bytes_per_token(torch.bfloat16)
                                 * 4096, torch.bfloat16,
                                 margin_bytes=estimated_margin(cfg, 32 * 2**30, 2048, 4096)(1))
    n_cpu = sum(flags)
    assert 0 < n_cpu < cfg.num_layers
    doc = json.loads(out.read_text())
    assert doc["meta"]["experts"] == f"cpu in {n_cpu} of {cfg.num_layers} MoE layers"
    assert doc["meta"]["gpu_weight_bytes"] == rl.gpu_weight_bytes(cfg, flags)
    assert cli.main(["plan", "--model", "mixtral-8x7b", "--profile", str(profile_file),
                     "--vram-budget", "6GiB", "--json", str(out), "--context-lengths", "4k"]) == 0
    assert json.loads(out.read_text())["meta"]["experts"] == "cpu"


def test_profile_json_round_trip_and_version(tmp_path):
    p = h200_like()
    path = tmp_path / "x.json"
    p.save(path)
    q = HardwareProfile.load(path)
    assert q == p
    d = json.loads(path.read_text())
    d["version"] = 999
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="version"):
        HardwareProfile.load(path)
    d["version"] = prof_mod.PROFILE_VERSION
    del d["cpu_read_Bps"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="cpu_read_Bps"):
        HardwareProfile.load(path)


def test_profile_lookups():
    p = h200_like(cpu_expert={"h2048-i768": 50e9, "h4096-i14336": 80e9})
    assert p.cpu_expert_rate(2048, 768) == 50e9
    assert p.cpu_expert_rate(4096, 12000) == 80e9  # nearest in size
    assert p.cpu_attn_rate("gqa-g99-d7", "C") == min(r["C"] for r in p.cpu_attn.values())
    assert p.scaled(cpu_attn=0.5).cpu_attn_rate("gqa-g8-d128", "T") == p.cpu_attn_rate("gqa-g8-d128", "T") / 2
    # FP8 experts' rates under their own keys; the bf16 rate where none was measured
    assert p.cpu_expert_rate(2048, 768, fp8=True) == 50e9
    q = h200_like(cpu_expert={"h2048-i768": 50e9, "h4096-i14336": 80e9, "h2048-i768-fp8": 30e9})
    assert q.cpu_expert_rate(2048, 768, fp8=True) == 30e9
    assert q.cpu_expert_rate(4096, 14336, fp8=True) == 30e9  # the nearest FP8 shape
    assert q.cpu_expert_rate(2048, 768) == 50e9 and q.cpu_expert_rate(4000, 14336) == 80e9


@pytest.fixture
def tiny_sizes(monkeypatch):
    MiB = 2 ** 20
    monkeypatch.setitem(cal.SIZES, "quick", dict(copy=8 * MiB, cpu_read=16 * MiB, concurrent_rounds=2,
                                                 cpu_attn=2 * MiB, dev_attn_gpu=8 * MiB,
                                                 dev_attn_cpu=MiB // 4, experts=MiB, reps=1, rt_reps=2))


def test_calibrate_command_writes_a_usable_profile(tmp_path, tiny_sizes, monkeypatch):
    cfg = tiny_cfg()
    monkeypatch.setattr(ModelConfig, "from_hf", classmethod(lambda cls, src: cfg))
    out = tmp_path / "prof.json"
    from writescope.attention import cpu
    before = cpu.current_isa_setting()
    assert cli.main(["calibrate", "--quick", "--out", str(out), "--model", "tiny"]) == 0
    p = HardwareProfile.load(out)
    assert p.quick and p.cpu_read_Bps > 0 and p.cpu_roundtrip_s > 0
    fam = "gqa-g2-d16"
    assert set(p.cpu_attn[fam]) == {"C", "T"} and p.cpu_attn[fam]["C"] > 0
    import torch
    assert p.device_attn[fam] > 0 and p.cpu_expert["h64-i32"] > 0
    from writescope.layers.cpu_experts import CpuExperts
    from writescope.models.quantization import Fp8Blocks
    if CpuExperts.fp8_unsupported(Fp8Blocks(), torch.bfloat16) is None:  # FP8 experts too
        assert p.cpu_expert["h64-i32-fp8"] > 0
    assert p.has_gpu == torch.cuda.is_available()
    if cpu.available():  # the fastest variant this CPU has, chosen by timing
        assert p.cpu_attn_isa[fam] in cpu.isas()
        assert cpu.current_isa_setting() == before  # calibration leaves the setting as it was


def test_engine_uses_the_calibrated_cpu_variant(tmp_path, tiny_qwen3_moe, monkeypatch):
    from writescope import LLM
    from writescope.attention import cpu
    if not cpu.available() or len(cpu.isas()) < 2:
        pytest.skip("needs two compiled CPU attention variants")
    from writescope.planner.roofline import attn_family
    fam = attn_family(ModelConfig.from_hf(tiny_qwen3_moe))
    prof = h200_like()
    isa = cpu.isas()[0]  # the slowest: certainly not what auto would pick
    prof.cpu_attn_isa = {fam: isa}
    path = tmp_path / "p.json"
    prof.save(path)
    monkeypatch.delenv("WRITESCOPE_CPU_ATTN_ISA", raising=False)
    cpu.set_isa("auto")  # no user choice (an earlier test may have left one)
    try:
        llm = LLM(str(tiny_qwen3_moe), device="cpu", dtype="float32", profile=str(path),
                  max_model_len=256)
        assert llm.engine.cpu_attn_isa == isa and cpu.get_isa() == isa
    finally:
        cpu.set_isa("auto")


def test_engine_uses_the_calibrated_prefetch_distance_unless_the_user_chose_one(
        tmp_path, tiny_qwen3_moe, monkeypatch):
    """A profile's AMX prefetch distance for the model's attention family is applied at engine
    start; the environment's (or a call's) choice wins; a profile without one restores the
    default an earlier engine's profile may have replaced."""
    from writescope import LLM
    from writescope.attention import cpu
    from writescope.planner.roofline import attn_family
    fam = attn_family(ModelConfig.from_hf(tiny_qwen3_moe))
    prof = h200_like()
    prof.cpu_attn_prefetch_blocks = {fam: 0}
    with_pf, without = tmp_path / "p.json", tmp_path / "q.json"
    prof.save(with_pf)
    assert HardwareProfile.load(with_pf).cpu_attn_prefetch_blocks == {fam: 0}
    h200_like().save(without)
    monkeypatch.delenv("WRITESCOPE_CPU_ATTN_PREFETCH_BLOCKS", raising=False)
    cpu.set_prefetch_blocks(None)
    kw = dict(device="cpu", dtype="float32", max_model_len=256)
    try:
        assert not cpu.prefetch_chosen_by_user()
        LLM(str(tiny_qwen3_moe), profile=str(with_pf), **kw)
        assert cpu.get_prefetch_blocks() == 0 and not cpu.prefetch_chosen_by_user()
        LLM(str(tiny_qwen3_moe), profile=str(without), **kw)
        assert cpu.get_prefetch_blocks() == cpu.DEFAULT_PREFETCH_BLOCKS
        cpu.set_prefetch_blocks(5)  # the user's choice
        LLM(str(tiny_qwen3_moe), profile=str(with_pf), **kw)
        assert cpu.get_prefetch_blocks() == 5 and cpu.prefetch_chosen_by_user()
    finally:
        cpu.set_prefetch_blocks(None)


@pytest.mark.parametrize("bad", [-1, 65, 1.5, True, "2"])
def test_profile_refuses_a_bad_prefetch_distance(bad):
    d = h200_like().to_dict()
    d["cpu_attn_prefetch_blocks"] = {"mla-h16-r576": bad}
    with pytest.raises(ValueError, match=r"cpu_attn_prefetch_blocks\[mla-h16-r576\]"):
        HardwareProfile.from_dict(d)


def test_full_calibration_times_the_amx_prefetch_distances(monkeypatch):
    """Outside quick mode, a family whose fastest variant is AMX gets the fastest of the
    distances tried, and the setting is left as it was; quick mode leaves the default."""
    from writescope.attention import cpu
    if not cpu.available() or "amx" not in cpu.isas():
        pytest.skip("needs the AMX CPU attention variant")
    cpu.set_prefetch_blocks(None)
    logs = []
    cfg = tiny_cfg()
    fam = cal.attn_family(cfg)
    monkeypatch.delenv("WRITESCOPE_CPU_ATTN_ISA", raising=False)
    monkeypatch.setattr(cpu, "isas", lambda: ["amx"])  # AMX the only candidate variant
    rates, _, isa, pf = cal.cpu_attention_rates([cfg], 4 * 2 ** 20, 1, logs.append)
    _, _, _, pf_quick = cal.cpu_attention_rates([cfg], 4 * 2 ** 20, 1, logs.append,
                                                tune_prefetch=False)
    assert isa == {fam: "amx"} and pf[fam] in cal.PREFETCH_CHOICES and pf_quick == {}
    assert rates[fam]["C"] > 0 and any("prefetch distances" in line for line in logs)
    assert cpu.get_prefetch_blocks() == cpu.DEFAULT_PREFETCH_BLOCKS
    assert not cpu.prefetch_chosen_by_user()


def test_load_or_calibrate_caches_and_extends(tmp_path, tiny_sizes, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("WRITESCOPE_PROFILE", raising=False)
    calls = []
    real = cal.calibrate

    def counting(**kw):
        calls.append(kw)
        return real(**kw)
    monkeypatch.setattr(cal, "calibrate", counting)
    a = load_or_calibrate(model_config=tiny_cfg())
    assert len(calls) == 1 and prof_mod.default_cache_path().exists()
    b = load_or_calibrate(model_config=tiny_cfg())
    assert len(calls) == 1 and b.cpu_attn == a.cpu_attn  # from the cache
    other = ModelConfig.from_hf({**tiny_cfg().raw, "num_key_value_heads": 4})
    c = load_or_calibrate(model_config=other)  # a new attention family: measured and merged
    assert len(calls) == 2 and {"gqa-g2-d16", "gqa-g1-d16"} <= set(c.cpu_attn)
    explicit = tmp_path / "given.json"
    h200_like().save(explicit)
    assert load_or_calibrate(str(explicit)).has_gpu and len(calls) == 2
    from writescope.attention import cpu
    if cpu.available() and os.environ.get("WRITESCOPE_CPU_ATTN_ISA", "auto") == "auto":
        assert set(c.cpu_attn_variants) == set(cpu.isas())
        # a cache calibrated before a kernel variant this build has: measured again, once
        stale = HardwareProfile.load(prof_mod.default_cache_path())
        stale.cpu_attn_variants = stale.cpu_attn_variants[:-1]
        stale.save(prof_mod.default_cache_path())
        d = load_or_calibrate(model_config=other)
        assert len(calls) == 3 and set(d.cpu_attn_variants) == set(cpu.isas())
        load_or_calibrate(model_config=other)
        assert len(calls) == 3


def test_plan_with_an_fp8_config_override(profile_file, tmp_path):
    """``--config-override`` as in ``writescope bench``: an -FP8 release's experts take one byte
    a weight, so under 32 GiB Qwen3-30B-A3B's experts fit on the GPU with ``--experts auto``,
    where half of its bf16 ones go to the CPU; a misspelt key is an error."""
    q = 'quantization_config={"quant_method":"fp8","weight_block_size":[128,128]}'
    docs = []
    for extra in ([], ["--config-override", q]):
        out = tmp_path / f"plan{len(docs)}.json"
        assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--profile", str(profile_file),
                         "--context-lengths", "1k", "--vram-budget", "32GiB",
                         "--json", str(out), *extra]) == 0
        docs.append(json.loads(out.read_text()))
    bf, fp = docs
    # (bf16: about half the MoE layers' experts fit beside the rest of the weights and the
    # activations, as the engine places them once it has measured those)
    assert bf["meta"]["experts"] == "cpu in 25 of 48 MoE layers" and fp["meta"]["experts"] == "gpu"
    assert fp["meta"]["gpu_weight_bytes"] < 32 * 2 ** 30
    assert fp["writescope"][0]["predicted_step_s"] < 0.2 * bf["writescope"][0]["predicted_step_s"]
    assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--profile", str(profile_file),
                     "--config-override", "num_hiden_layers=2"]) != 0


def test_plan_says_when_the_profile_lacks_fp8_expert_rates(capsys):
    """An FP8 model's experts on the CPU, against a profile calibrated before FP8 rates were
    measured (the committed H200 profile): the plan says its FP8 expert times are optimistic;
    with a profile that has them (the fifty-fifth session's calibration) it says nothing."""
    q = ('quantization_config={"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic",'
         '"weight_block_size":[128,128]}')
    args = ["plan", "--model", "qwen3-30b-a3b", "--vram-budget", "32GiB", "--batch", "4",
            "--context-lengths", "8k", "--config-override", q]
    assert cli.main(args + ["--profile", "bench/profiles/h200.json"]) == 0
    assert "no FP8 CPU expert rates" in capsys.readouterr().err
    assert cli.main(args + ["--profile", "bench/results/2026-12-05f-h200/call2/h200-profile.json"]) == 0
    assert "no FP8 CPU expert rates" not in capsys.readouterr().err


def test_a_closed_pipe_ends_the_command_quietly(profile_file, monkeypatch):
    """`writescope plan ... | head -1`: once the reader has gone, the command stops with the
    shell's status for a closed pipe (141) instead of a traceback."""
    import io

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Closed())
    assert cli.main(["plan", "--model", "qwen3-30b-a3b", "--profile", str(profile_file),
                     "--context-lengths", "1k"]) == 141
