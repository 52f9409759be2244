"""The reference models' architectures (Qwen3-30B-A3B: GQA 32/4/128 with q/k norms, 128 experts
top-8; Mixtral-8x7B: GQA 32/8/128, 8 experts top-2) built from the shipped configs with only their
sizes reduced (``config_overrides`` / ``writescope bench --config-override``), run through the
bench's rows: every KV policy, routed experts on the CPU and on the device, KV spilled past a
2-block G region, and the transformers peer on the same weights. This is the code path of the
full-size ``--random-weights`` rows on the GPU machine, minus the GPU kernels."""
from __future__ import annotations

import pytest
import torch

from writescope.bench.grid import DEFAULT_POLICIES, GridSpec, parse_overrides, run_grid
from writescope.engine.model_source import apply_config_overrides, resolve_model

#: heads, KV heads, head_dim, experts and top-k as published; layers, widths and vocabulary cut
REDUCED = {
    "qwen3-30b-a3b": dict(num_hidden_layers=2, hidden_size=256, vocab_size=1024,
                          moe_intermediate_size=64, intermediate_size=256),
    "mixtral-8x7b": dict(num_hidden_layers=2, hidden_size=256, head_dim=128, vocab_size=1024,
                         intermediate_size=128),
}
ARCH = {  # (heads, kv heads, head_dim, experts, top-k, q/k norm)
    "qwen3-30b-a3b": (32, 4, 128, 128, 8, True),
    "mixtral-8x7b": (32, 8, 128, 8, 2, False),
}


def test_overrides_parse_and_reject_unknown_keys():
    assert parse_overrides(["num_hidden_layers=2,hidden_size=256", "norm_topk_prob=false",
                            "head_dim=128"]) == {"num_hidden_layers": 2, "hidden_size": 256,
                                                 "norm_topk_prob": False, "head_dim": 128}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["num_hidden_layers"])
    with pytest.raises(ValueError, match="not a key"):
        apply_config_overrides({"model_type": "mixtral", "hidden_size": 4}, {"hiden_size": 2})
    with pytest.raises(ValueError, match="random_weights"):
        resolve_model("qwen3-30b-a3b", False, {"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="random-weights"):
        GridSpec(models=["qwen3-30b-a3b"], batches=[1], context_lengths=[8],
                 config_overrides={"num_hidden_layers": 2}).validate()


@pytest.mark.parametrize("model", sorted(REDUCED))
def test_reduced_config_keeps_the_architecture(model):
    cfg, ckpt, name = resolve_model(model, True, REDUCED[model])
    full, _, _ = resolve_model(model, True)
    assert ckpt is None and name == model
    heads, kv, d, experts, topk, qk_norm = ARCH[model]
    for c in (cfg, full):
        assert (c.num_heads, c.num_kv_heads, c.head_dim, c.num_experts, c.num_experts_per_tok,
                c.qk_norm) == (heads, kv, d, experts, topk, qk_norm)
        assert c.norm_topk_prob and not c.dense_layers and c.rope_theta == 1e6
    assert cfg.num_layers == 2 and full.num_layers == {"qwen3-30b-a3b": 48, "mixtral-8x7b": 32}[model]
    assert cfg.raw.get("sliding_window") is None  # both published configs: full attention


@pytest.mark.parametrize("experts", ["cpu", "gpu"])
@pytest.mark.parametrize("model", sorted(REDUCED))
def test_reduced_reference_model_runs_every_policy(model, experts, tmp_path):
    from test_migrate import synthetic_profile

    prof = tmp_path / "profile.json"
    synthetic_profile().save(prof)
    peers = ["transformers"] if experts == "cpu" else []  # the peer unpacks the CPU layout
    spec = GridSpec(models=[model], batches=[2], context_lengths=[200], decode_steps=4,
                    policies=list(DEFAULT_POLICIES), peers=peers, out=str(tmp_path / "out"),
                    random_weights=True, dtype="float32", device="cpu", num_gpu_blocks=2,
                    experts=experts, profile=str(prof), max_num_batched_tokens=128,
                    config_overrides=REDUCED[model])
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        doc = run_grid(spec, progress=False, log=lambda m: None)
    finally:
        torch.set_num_threads(n)
    meta = doc["models"][model]
    assert meta["config_overrides"] == REDUCED[model]
    assert meta["experts_on_cpu_layers"] == (2 if experts == "cpu" else 0)
    rows = doc["rows"]
    assert len(rows) == len(DEFAULT_POLICIES) + len(peers)
    assert all(not r.get("error") for r in rows), [(r["policy"], r.get("error")) for r in rows]
    engine_rows = [r for r in rows if not r["peer"]]
    # float32: every policy (and the peer) decodes the same tokens from the same weights
    assert len({r["output_digest"] for r in rows}) == 1
    for r in engine_rows:
        b = r["blocks"]
        assert b["G"] == 2 and b["T"] + b["C"] == 4, b  # 2 x 204 tokens: 6 sealed blocks, 2 in G
        assert len(r["step_times_s"]) == 4
    by = {r["policy"]: r for r in engine_rows}
    assert by["transfer"]["blocks"]["C"] == 0 and by["transfer"]["cpu_share_mean"] == 0
    assert by["cpu"]["blocks"]["T"] == 0 and by["cpu"]["cpu_share_mean"] > 0
    assert all(by[p]["bytes_moved"] == 0 for p in by if p != "migrate")
    if peers:
        assert rows[-1]["same_tokens_as_writescope"] == 1.0


def test_default_host_budgets_leave_room_beside_host_experts(monkeypatch):
    """Mixtral-8x7B, experts on the CPU (84 GiB), batch 4 x 32K on a 128 GiB host: T and C
    each sized for the spilled KV (the whole KV less the G blocks asked for), and together
    capped at what host memory has left beside the experts and the reserve."""
    from writescope.bench import host_budgets as g
    from writescope.models.config import ModelConfig

    GiB = 2**30
    cfg = ModelConfig.from_hf("mixtral-8x7b")
    spec = GridSpec(models=["mixtral-8x7b"], batches=[4], context_lengths=[32768], decode_steps=16,
                    random_weights=True, device="cuda", vram_budget="32GiB", experts="cpu")
    monkeypatch.setattr("writescope.hostmem.available_ram_bytes", lambda: 125 * GiB)
    monkeypatch.setattr("os.sysconf", lambda k: {"SC_PAGE_SIZE": 4096,
                                                     "SC_PHYS_PAGES": 126 * GiB // 4096}[k])
    assert g.host_weight_bytes(cfg, spec, 32804) == 84 * GiB
    block = 64 * 131072  # 8 MiB
    pinned, host = g.default_host_budgets(cfg, spec, 32804)
    assert pinned == host == (125 - 84 - 10) * GiB // 2 < 4 * 514 * block  # capped: 15.5 GiB
    spec.num_gpu_blocks = 640  # G takes 640 blocks: T and C need only the rest
    pinned, host = g.default_host_budgets(cfg, spec, 32804)
    assert pinned == host == (4 * 514 - 640) * block
    spec.pinned_budget = "20GiB"
    pinned, host = g.default_host_budgets(cfg, spec, 32804)
    assert pinned == "20GiB" and host == (125 - 84 - 10 - 20) * GiB
