"""The tiny checkpoints of conftest.py are what they claim to be (other tests rely on it)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from conftest import (ENDOFTEXT_ID, IM_END_ID, MISSING_TENSOR, TINY_VOCAB, WRONG_SHAPE_TENSOR,
                      hf_model)
from writescope.models.config import ConfigError, ModelConfig
from writescope.models.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _keys(path):
    keys = set()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            keys |= set(sf.keys())
    return keys


@torch.no_grad()
def test_greedy_decoding_is_well_separated(all_tiny):
    """Greedy decoding over 48 tokens never meets a near tie between the top two logits, so
    float32 reorderings in another engine cannot flip a token."""
    model = hf_model(all_tiny)
    tok = Tokenizer.from_pretrained(all_tiny)
    ids = torch.tensor([tok.encode("The morning was cold and clear.")])
    out = model.generate(ids, max_new_tokens=48, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    gaps = [float(s.topk(2).values[0, 0] - s.topk(2).values[0, 1]) for s in out.scores]
    assert min(gaps) > 1e-3, gaps
    generated = out.sequences[0, ids.shape[1]:].tolist()
    assert len(set(generated)) > 3  # not one token repeated
    spread = [float(s.std()) for s in out.scores]
    assert min(spread) > 0.5  # logits far from flat


@torch.no_grad()
def test_routing_is_decisive(all_tiny):
    """The router's k-th and (k+1)-th choices are clearly apart for most tokens."""
    model = hf_model(all_tiny)
    cfg = model.config
    k = cfg.num_experts_per_tok
    captured = []
    gates = [m for n, m in model.named_modules()
             if n.endswith("mlp.gate") or n.endswith("block_sparse_moe.gate")]
    assert gates
    hooks = [g.register_forward_hook(
        lambda mod, inp, out: captured.append(inp[0].reshape(-1, inp[0].shape[-1]) @ mod.weight.T))
        for g in gates]
    model(torch.arange(4, 68).unsqueeze(0))
    for h in hooks:
        h.remove()
    logits = torch.cat(captured).float()
    top = logits.topk(k + 1, dim=-1).values
    margin = top[:, k - 1] - top[:, k]
    assert (margin > 0.05).float().mean() > 0.9


def test_tiny_configs_as_described(tiny_mixtral, tiny_qwen3_moe, tiny_deepseek_v2,
                                   tiny_deepseek_v2_qlora):
    m = ModelConfig.from_hf(tiny_mixtral)
    assert (m.model_type, m.num_layers, m.num_experts, m.num_kv_heads, m.head_dim) == \
        ("mixtral", 2, 4, 2, 16)
    q = ModelConfig.from_hf(tiny_qwen3_moe)
    assert (q.model_type, q.num_layers, q.num_experts, q.head_dim, q.norm_topk_prob) == \
        ("qwen3_moe", 3, 8, 32, True)
    d = ModelConfig.from_hf(tiny_deepseek_v2)
    assert d.q_lora_rank is None and d.dense_layers == (0,) and d.num_shared_experts == 1
    assert d.rope_scaling is None and d.topk_method == "greedy"
    y = ModelConfig.from_hf(tiny_deepseek_v2_qlora)
    assert y.q_lora_rank == 48 and y.topk_method == "group_limited_greedy"
    assert (y.n_group, y.topk_group, y.routed_scaling_factor) == (4, 2, 2.5)
    assert y.rope_scaling["rope_type"] == "yarn"
    assert (y.rope_scaling["mscale"], y.rope_scaling["mscale_all_dim"]) == (0.9, 0.7)
    for c in (m, q, d, y):
        assert c.vocab_size == TINY_VOCAB and c.max_position_embeddings >= 1024
    raw = json.loads((tiny_deepseek_v2_qlora / "config.json").read_text())
    assert "rope_parameters" not in raw and raw["rope_scaling"]["type"] == "yarn"
    assert raw["rope_theta"] == 10000.0


def test_hub_style_configs_match(all_hub):
    """Old-key config.json files normalise like the transformers-5 ones they came from."""
    raw = json.loads((all_hub / "config.json").read_text())
    assert "rope_parameters" not in raw and "rope_theta" in raw and "torch_dtype" in raw
    if raw["model_type"] == "qwen3_moe":
        assert "num_experts" in raw and "num_local_experts" not in raw
    cfg = ModelConfig.from_hf(all_hub)
    assert cfg.vocab_size == TINY_VOCAB


def test_tokenizer_in_every_checkpoint(all_tiny):
    tok = Tokenizer.from_pretrained(all_tiny)
    assert tok.vocab_size == TINY_VOCAB
    assert IM_END_ID in tok.eos_token_ids
    text = "Hello, world: naïve café 東京 🙂"
    assert tok.decode(tok.encode(text)) == text


def test_generation_eos_union(tiny_qwen3_moe, tiny_mixtral):
    assert set(Tokenizer.from_pretrained(tiny_qwen3_moe).eos_token_ids) == {IM_END_ID, ENDOFTEXT_ID}
    assert Tokenizer.from_pretrained(tiny_mixtral).eos_token_ids == (IM_END_ID,)


def test_sharded_checkpoint(tiny_qwen3_moe, tiny_qwen3_moe_sharded):
    shards = sorted(tiny_qwen3_moe_sharded.glob("*.safetensors"))
    assert len(shards) > 1
    index = json.loads((tiny_qwen3_moe_sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == _keys(tiny_qwen3_moe_sharded) == _keys(tiny_qwen3_moe)


def test_hub_tensor_names(tiny_mixtral, tiny_qwen3_moe, tiny_deepseek_v2, tiny_deepseek_v2_qlora):
    """save_pretrained writes the hub's per-expert names (not transformers-5's fused ones)."""
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in _keys(tiny_mixtral)
    assert "model.layers.2.mlp.experts.7.up_proj.weight" in _keys(tiny_qwen3_moe)
    ds = _keys(tiny_deepseek_v2)
    assert "model.layers.0.mlp.gate_proj.weight" in ds  # first_k_dense_replace
    assert "model.layers.1.mlp.shared_experts.down_proj.weight" in ds
    assert "model.layers.1.self_attn.q_proj.weight" in ds
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in ds
    ql = _keys(tiny_deepseek_v2_qlora)
    assert {"model.layers.1.self_attn.q_a_proj.weight", "model.layers.1.self_attn.q_a_layernorm.weight",
            "model.layers.1.self_attn.q_b_proj.weight"} <= ql
    assert not any("gate_up_proj" in k for k in _keys(tiny_qwen3_moe) | ds | ql)


def test_bad_checkpoints(bad_missing_tensor, bad_wrong_shape, bad_unknown_arch, tiny_qwen3_moe):
    assert MISSING_TENSOR in _keys(tiny_qwen3_moe)
    assert MISSING_TENSOR not in _keys(bad_missing_tensor.path)
    assert _keys(bad_missing_tensor.path) | {MISSING_TENSOR} == _keys(tiny_qwen3_moe)
    with safe_open(str(bad_wrong_shape.path / "model.safetensors"), "pt") as f:
        assert list(f.get_slice(WRONG_SHAPE_TENSOR).get_shape()) == [63, 64]
    with pytest.raises(ConfigError, match="unknown_arch"):
        ModelConfig.from_hf(bad_unknown_arch.path)
