"""Checkpoint loading: errors that name the tensor and the file; random weights at full size."""
from __future__ import annotations

import pytest
import torch

from writescope.models.config import ConfigError, ModelConfig
from writescope.models.loader import CheckpointError, build_model


def _load(path):
    return build_model(ModelConfig.from_hf(path), dtype=torch.float32, device="cpu", checkpoint=path)


def test_missing_tensor(bad_missing_tensor):
    with pytest.raises(CheckpointError, match="missing tensor") as e:
        _load(bad_missing_tensor.path)
    assert bad_missing_tensor.tensor in str(e.value)


def test_wrong_shape(bad_wrong_shape):
    with pytest.raises(CheckpointError) as e:
        _load(bad_wrong_shape.path)
    msg = str(e.value)
    assert bad_wrong_shape.tensor in msg and bad_wrong_shape.file in msg and "shape" in msg


def test_unknown_arch(bad_unknown_arch):
    with pytest.raises(ConfigError, match="unknown_arch"):
        _load(bad_unknown_arch.path)


def test_unexpected_tensor(tmp_path, tiny_qwen3_moe):
    import shutil

    from safetensors.torch import load_file, save_file
    dst = tmp_path / "extra"
    shutil.copytree(tiny_qwen3_moe, dst)
    sd = load_file(dst / "model.safetensors")
    sd["model.layers.0.self_attn.bogus.weight"] = torch.zeros(2)
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.self_attn.bogus.weight' in model.safetensors"):
        _load(dst)


def test_dtype_converted_on_load(tiny_mixtral):
    m = build_model(ModelConfig.from_hf(tiny_mixtral), dtype=torch.bfloat16, device="cpu",
                    checkpoint=tiny_mixtral)
    assert m.lm_head.weight.dtype == torch.bfloat16


def test_random_weights_seeded_and_scaled():
    cfg = ModelConfig.from_hf({**ModelConfig.from_hf("qwen3-30b-a3b").raw, "num_hidden_layers": 2,
                               "num_experts": 8, "vocab_size": 1000})
    a = build_model(cfg, dtype=torch.float32, device="cpu", random_weights=True, seed=3)
    b = build_model(cfg, dtype=torch.float32, device="cpu", random_weights=True, seed=3)
    c = build_model(cfg, dtype=torch.float32, device="cpu", random_weights=True, seed=4)
    wa = a.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(wa, b.model.layers[1].self_attn.q_proj.weight)
    assert not torch.equal(wa, c.model.layers[1].self_attn.q_proj.weight)
    assert abs(wa.std().item() - 0.02) < 0.002  # initializer_range
    assert torch.all(a.model.norm.weight == 1)
