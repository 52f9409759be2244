"""The estimate of the device bytes an engine on a GPU keeps for its steps
(``planner/activations.py``), against the H100 engines that measured them, and the plan that
uses it."""
import json
import math
from pathlib import Path

import pytest
import torch

from writescope.models.config import ModelConfig
from writescope.planner import activations as act

ROOT = Path(__file__).resolve().parents[1]
CALL = ROOT / "bench" / "results" / "2026-12-05i-h100" / "call2"


def _bench_max_len(context: int, batch: int, steps: int, batched: int) -> int:
    """``writescope bench``'s max_model_len for a one-row grid (``bench/grid.py``)."""
    return context + steps + math.ceil(batch * context / batched) + batch + 8


@pytest.mark.parametrize("row", ["bf16-64k-kvauto", "bf16-64k-auto", "bf16-128k-kvauto",
                                 "bf16-128k-auto"])
def test_the_estimate_is_what_h100_engines_measured(row):
    """Four engines (Qwen3-30B-A3B bf16, 16384 batched tokens, routed experts on the CPU in
    32-48 layers) measured their warm-up forward and kept the gathered context beside it:
    ``activation_bytes`` in each row's model meta."""
    doc = json.loads((CALL / row / "results.json").read_text())
    meta = doc["models"]["qwen3-30b-a3b"]
    cfg = ModelConfig.from_hf("qwen3-30b-a3b")
    context = doc["rows"][0]["context"]
    max_len = _bench_max_len(context, 4, 16, 16384)
    est = act.warmup_peak_bytes(cfg, torch.bfloat16, min(16384, max_len), cpu_experts=True) \
        + act.context_gather_bytes(cfg, torch.bfloat16, max_len)
    assert meta["experts_on_cpu_layers"] > 0
    assert est == pytest.approx(meta["activation_bytes"], rel=0.03)
    # and the buffers the engine keeps on CUDA besides
    assert act.reserve_bytes(cfg, torch.bfloat16, 16384, max_len) - est == meta["buffer_bytes"]


def test_what_the_estimate_counts(monkeypatch):
    qwen = ModelConfig.from_hf("qwen3-30b-a3b")
    ds = ModelConfig.from_hf("deepseek-v2-lite")
    bf16 = torch.bfloat16
    one_layer = qwen.num_experts * 3 * qwen.hidden_size * qwen.moe_intermediate_size * 2
    # the upload buffer (one layer's experts) only with CPU experts and prefill-sized steps
    with_cpu = act.warmup_peak_bytes(qwen, bf16, 4096, cpu_experts=True)
    gpu_only = act.warmup_peak_bytes(qwen, bf16, 4096, cpu_experts=False)
    assert with_cpu - gpu_only == pytest.approx(act.ALLOCATOR_SLACK * one_layer, abs=2)
    assert act.warmup_peak_bytes(qwen, bf16, 512, True) == act.warmup_peak_bytes(qwen, bf16, 512,
                                                                                 False)
    monkeypatch.setenv("WRITESCOPE_EXPERT_UPLOAD_TOKENS", "0")  # the uploader is off
    assert act.warmup_peak_bytes(qwen, bf16, 4096, True) == gpu_only
    monkeypatch.delenv("WRITESCOPE_EXPERT_UPLOAD_TOKENS")
    # FP8 experts upload their codes and scales: less than bf16's
    fp8 = ModelConfig.from_hf(dict(qwen.raw, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]}))
    assert gpu_only < act.warmup_peak_bytes(fp8, bf16, 4096, True) < with_cpu
    assert act.warmup_peak_bytes(qwen, bf16, 8192, False) > gpu_only
    # the gathered context: two layers' KV of max_model_len tokens; MLA's decompressed heads too
    assert act.context_gather_bytes(qwen, bf16, 1000) == 2 * qwen.kv_spec(bf16).token_bytes(1) * 1000
    assert act.context_gather_bytes(ds, bf16, 1000) > 2 * ds.kv_spec(bf16).token_bytes(1) * 1000
    # off CUDA the engine plans its activations from the config: only the gathered context
    assert act.reserve_bytes(qwen, bf16, 2048, 1000, cuda=False) == \
        act.context_gather_bytes(qwen, bf16, 1000)


def test_the_plan_shows_the_split_the_h100_engines_ended_with(tmp_path, capsys):
    """With that call's calibration and --max-num-batched-tokens 16384, `writescope plan`
    places the experts as the engines did once they had measured (32 of 48 layers on the CPU at
    4 x 64K, 37 at 4 x 128K, after moving 3 and 2) and predicts the steps their bench rows
    modelled; its best split is the one --kv-cache-memory auto ended with (every layer's experts
    on the CPU)."""
    from writescope.cli import main
    # (those engines ran every step as one batch: the split form came in the fifty-ninth session)
    base = ["plan", "--model", "qwen3-30b-a3b", "--vram-budget", "32GiB", "--batch", "4",
            "--profile", str(CALL / "h200-profile.json"), "--max-num-batched-tokens", "16384",
            "--pipeline-experts", "off"]
    for ctx, layers in (("64k", 32), ("128k", 37)):
        out = tmp_path / f"{ctx}.json"
        assert main(base + ["--context-lengths", ctx, "--json", str(out)]) == 0
        text = capsys.readouterr().out
        assert f"experts on cpu in {layers} of 48 MoE layers" in text
        assert "(activations estimated for 16384 batched tokens)" in text
        split = json.loads(out.read_text())["expert_splits"][0]
        for form, n_cpu, step in (("auto", layers, split["step_s"]),
                                  ("kvauto", 48, split["best_step_s"])):
            doc = json.loads((CALL / f"bf16-{ctx}-{form}" / "results.json").read_text())
            assert doc["models"]["qwen3-30b-a3b"]["experts_on_cpu_layers"] == n_cpu
            assert step == pytest.approx(doc["rows"][0]["model_step_s"], rel=0.01)
        assert split["best_cpu_layers"] == 48 and split["kv_cache_memory"] is None
    assert main(base + ["--context-lengths", "8k", "--max-num-batched-tokens", "0"]) == 1
    assert "--max-num-batched-tokens must be >= 1" in capsys.readouterr().err
