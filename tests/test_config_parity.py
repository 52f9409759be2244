"""Config fields that change the numbers: what transformers does with them, writescope does too,
or it refuses the checkpoint (or the length) by name. Tiny checkpoints, float32, greedy tokens
and log-probabilities against transformers in float64 (``test_parity``'s oracle)."""
from __future__ import annotations

import pytest
import torch

from conftest import TINY_VOCAB, build_tiny_checkpoint, hf_model
from test_parity import check, greedy_reference, prompt_ids
from writescope import LLM, SamplingParams
from writescope.models.config import ConfigError

NEW = 8


def _matches(path, prompt_len: int = 40, **kw) -> None:
    opts = dict(dtype="float32", device="cpu", block_size=16, max_num_batched_tokens=32,
                max_model_len=128, kv_policy="static", cpu_share=0.5, num_gpu_blocks=2)
    opts.update(kw)
    llm = LLM(str(path), **opts)
    ids = prompt_ids(TINY_VOCAB, prompt_len)
    (out,) = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True,
                                                logprobs=5))
    check(out, *greedy_reference(hf_model(path, dtype=torch.float64), tuple(ids), NEW))


def test_deepseek_norm_topk_prob_is_not_read_as_in_transformers(tmp_path, tiny_tokenizer_dir):
    # transformers scales the top-k weights and never normalises them (DeepSeek's own V2 code
    # would normalise instead): a top-2 router with a scale of 2.5
    path = build_tiny_checkpoint("deepseek_v2", tmp_path / "m", tokenizer_dir=tiny_tokenizer_dir,
                                 norm_topk_prob=True, routed_scaling_factor=2.5)
    with pytest.warns(UserWarning, match="norm_topk_prob is not read"):
        _matches(path)


def test_deepseek_moe_layer_freq_is_not_read_as_in_transformers(tmp_path, tiny_tokenizer_dir):
    path = build_tiny_checkpoint("deepseek_v2", tmp_path / "m", tokenizer_dir=tiny_tokenizer_dir,
                                 moe_layer_freq=2)
    with pytest.warns(UserWarning, match="moe_layer_freq 2 is not read"):
        _matches(path)


def test_deepseek_without_shared_experts(tmp_path, tiny_tokenizer_dir):
    # transformers saves empty shared-expert projections; they hold no weights
    path = build_tiny_checkpoint("deepseek_v2", tmp_path / "m", tokenizer_dir=tiny_tokenizer_dir,
                                 n_shared_experts=0)
    _matches(path)


@pytest.mark.parametrize("arch,window", [("mixtral", dict(sliding_window=24)),
                                         ("qwen3_moe", dict(use_sliding_window=True,
                                                            sliding_window=24))])
def test_sliding_window_runs_up_to_the_window(tmp_path, tiny_tokenizer_dir, arch, window):
    """Full attention is the window's attention up to the window: the engine runs a windowed
    checkpoint that far (its default max_model_len, with a warning) and refuses longer."""
    path = build_tiny_checkpoint(arch, tmp_path / "m", tokenizer_dir=tiny_tokenizer_dir,
                                 **window)
    with pytest.raises(ValueError, match="sliding window \\(24 tokens\\).*at most 24"):
        LLM(str(path), dtype="float32", device="cpu", max_model_len=128)
    with pytest.warns(RuntimeWarning, match="sliding window of 24 tokens"):
        llm = LLM(str(path), dtype="float32", device="cpu", block_size=8)
    assert llm.engine.max_model_len == 24
    _matches(path, prompt_len=24 - NEW, max_model_len=24, block_size=8)


def test_random_weights_run_past_the_window():
    llm = LLM("mixtral-8x7b", random_weights=True, device="cpu", dtype="float32",
              max_model_len=96, config_overrides={
                  "num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 32,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                  "num_local_experts": 4, "sliding_window": 16})
    assert llm.engine.max_model_len == 96


def test_an_activation_other_than_silu_is_refused(tmp_path, tiny_tokenizer_dir):
    path = build_tiny_checkpoint("qwen3_moe", tmp_path / "m", tokenizer_dir=tiny_tokenizer_dir,
                                 hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not supported"):
        LLM(str(path), device="cpu")
