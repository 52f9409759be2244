"""ModelConfig.from_hf: both key styles, the reference configs, clear errors."""
from __future__ import annotations

import json

import pytest

from writescope.models.config import ConfigError, ModelConfig


def test_reference_models_have_published_sizes():
    # parameter counts of the published checkpoints (transformers meta-device build)
    expect = {"deepseek-v2-lite": 15.71e9, "qwen3-30b-a3b": 30.53e9, "mixtral-8x7b": 46.70e9}
    kv = {"deepseek-v2-lite": 31104, "qwen3-30b-a3b": 98304, "mixtral-8x7b": 131072}
    for name, total in expect.items():
        c = ModelConfig.from_hf(name)
        assert abs(c.param_counts()["total"] - total) / total < 5e-4
        assert c.kv_bytes_per_token() == kv[name]


def test_deepseek_v2_lite_fields():
    c = ModelConfig.from_hf("deepseek-v2-lite")
    assert c.is_mla and c.q_lora_rank is None and c.kv_lora_rank == 512
    assert c.dense_layers == (0,) and c.num_shared_experts == 2
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["mscale_all_dim"] == 0.707
    spec = c.kv_spec(__import__("torch").bfloat16)
    assert (spec.rec_dim, spec.k_dim, spec.v_dim, spec.num_kv_heads) == (576, 576, 512, 1)
    # YaRN mscale: 1/sqrt(192) * (0.1 * 0.707 * ln 40 + 1)^2
    import math
    m = 0.1 * 0.707 * math.log(40) + 1
    assert c.softmax_scale == pytest.approx(192 ** -0.5 * m * m)


def test_new_and_old_rope_keys_agree():
    old = json.loads(json.dumps(ModelConfig.from_hf("deepseek-v2-lite").raw))
    new = dict(old)
    rs = dict(new.pop("rope_scaling"))
    rs["rope_type"] = rs.pop("type")
    rs["rope_theta"] = new.pop("rope_theta")
    new["rope_parameters"] = rs
    a, b = ModelConfig.from_hf(old), ModelConfig.from_hf(new)
    assert a.rope_theta == b.rope_theta and a.rope_scaling == b.rope_scaling


def test_max_positions_is_vllms_derived_max_model_len():
    # no scaling: max_position_embeddings; DeepSeek-V2-Lite's YaRN: 4096 x 40
    assert ModelConfig.from_hf("qwen3-30b-a3b").max_positions == 40960
    assert ModelConfig.from_hf("mixtral-8x7b").max_positions == 32768
    assert ModelConfig.from_hf("deepseek-v2-lite").max_positions == 163840
    raw = ModelConfig.from_hf("qwen3-30b-a3b").raw
    # Qwen's YaRN block for Qwen3 (max_position_embeddings stays 40960): 32768 x 4
    yarn = dict(raw, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32768})
    assert ModelConfig.from_hf(yarn).max_positions == 131072
    lin = dict(raw, rope_scaling={"type": "linear", "factor": 2.0})
    assert ModelConfig.from_hf(lin).max_positions == 81920
    # a YaRN block without the original length or the factor gets transformers' defaults
    c = ModelConfig.from_hf(dict(raw, rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    assert c.rope_scaling["original_max_position_embeddings"] == 40960 and c.max_positions == 81920
    c = ModelConfig.from_hf(dict(raw, rope_scaling={"rope_type": "yarn", "factor": None,
                                                    "original_max_position_embeddings": 10240}))
    assert c.rope_scaling["factor"] == 4.0 and c.max_positions == 40960


def test_qwen3_expert_key_variants():
    raw = ModelConfig.from_hf("qwen3-30b-a3b").raw
    alt = dict(raw)
    alt["num_local_experts"] = alt.pop("num_experts")
    assert ModelConfig.from_hf(alt).num_experts == 128


def test_group_limited_and_qlora(tmp_path):
    raw = dict(ModelConfig.from_hf("deepseek-v2-lite").raw, q_lora_rank=1536,
               topk_method="group_limited_greedy", n_group=8, topk_group=3)
    c = ModelConfig.from_hf(raw)
    assert c.q_lora_rank == 1536 and c.topk_method == "group_limited_greedy" and c.n_group == 8


def test_unsupported_model_type_is_named():
    with pytest.raises(ConfigError, match="unsupported model_type 'llama'"):
        ModelConfig.from_hf({"model_type": "llama"})


def test_missing_field_is_named():
    raw = dict(ModelConfig.from_hf("mixtral-8x7b").raw)
    del raw["num_local_experts"]
    with pytest.raises(ConfigError, match="num_local_experts"):
        ModelConfig.from_hf(raw)


def test_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_hf(tmp_path / "nope")


@pytest.mark.parametrize("override, msg", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok must be from 1 to the 8 experts"),
    ({"num_hidden_layers": -2}, "num_hidden_layers must be a positive integer"),
    ({"num_key_value_heads": 5}, "must be a multiple of num_key_value_heads"),
    ({"hidden_size": 0}, "hidden_size must be a positive integer")])
def test_sizes_a_model_cannot_have_are_named(override, msg):
    """A config override (``--config-override``) may set any number: one that cannot build a
    model is a ConfigError naming it, not a failure deep in the build."""
    from writescope.engine.model_source import apply_config_overrides
    from writescope.models.config import load_config_dict
    d = apply_config_overrides(load_config_dict("mixtral-8x7b"), override)
    with pytest.raises(ConfigError, match=msg):
        ModelConfig.from_hf(d)
