"""writescope.models.default: the built-in default checkpoint."""
from __future__ import annotations

import hashlib
import json
import math
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from writescope.models import default as dm
from writescope.models.config import ModelConfig
from writescope.models.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("torch_single_thread")

FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"}


def _hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


def test_build_is_deterministic(tmp_path, default_model_dir):
    a = dm.build_default_model(tmp_path / "a")
    b = dm.build_default_model(tmp_path / "b")
    ha, hb = _hashes(a), _hashes(b)
    assert set(ha) == FILES
    assert ha == hb == _hashes(default_model_dir)


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("WRITESCOPE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dm.cache_root() == tmp_path / "home" / ".cache" / "writescope"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.cache_root() == tmp_path / "xdg" / "writescope"
    monkeypatch.setenv("WRITESCOPE_CACHE", str(tmp_path / "ws"))
    assert dm.cache_root() == tmp_path / "ws"


def test_default_model_path_builds_once(writescope_cache, default_model_dir):
    p = dm.default_model_path()
    assert p == writescope_cache / dm.DEFAULT_MODEL_NAME and p.name == "default-moe-v1"
    assert _hashes(p) == _hashes(default_model_dir)
    mtime = (p / "model.safetensors").stat().st_mtime_ns
    assert dm.default_model_path() == p
    assert (p / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert [q.name for q in writescope_cache.iterdir()] == [dm.DEFAULT_MODEL_NAME]


def test_racing_first_use(writescope_cache, default_model_dir, monkeypatch):
    """Several builders finish before any of them renames: one wins, the others discard their
    copy and return the winner's folder; no temporary folders are left behind."""
    n = 4
    barrier = threading.Barrier(n)
    real_build = dm.build_default_model

    def build_then_wait(dst):
        out = real_build(dst)
        barrier.wait(timeout=60)
        return out

    monkeypatch.setattr(dm, "build_default_model", build_then_wait)
    results, errors = [], []

    def worker():
        try:
            results.append(dm.default_model_path())
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == n and len(set(results)) == 1
    assert _hashes(results[0]) == _hashes(default_model_dir)
    assert [q.name for q in writescope_cache.iterdir()] == [dm.DEFAULT_MODEL_NAME]


def test_config_and_tensor_names(default_model_dir):
    cfg = ModelConfig.from_hf(default_model_dir)
    tok = Tokenizer.from_pretrained(default_model_dir)
    assert cfg.model_type == "qwen3_moe"
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok) == (4, 256, 8, 2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.moe_intermediate_size) == (4, 2, 64, 256)
    assert cfg.vocab_size == tok.vocab_size == dm.TOKENIZER_VOCAB
    assert cfg.max_position_embeddings == 4096 and cfg.dense_layers == ()
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(4):
        p = f"model.layers.{i}."
        expected |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                     "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                                     "mlp.gate.weight")}
        expected |= {f"{p}self_attn.{x}_proj.weight" for x in "qkvo"}
        expected |= {f"{p}mlp.experts.{e}.{x}_proj.weight" for e in range(8)
                     for x in ("gate", "up", "down")}
    with safe_open(str(default_model_dir / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == expected
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [128, 256]
        assert f.get_slice("model.layers.3.mlp.experts.7.down_proj.weight").get_shape() == [256, 256]
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16


def test_tokenizer_and_chat_template(default_model_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)
    assert len(hf) == dm.TOKENIZER_VOCAB
    assert (hf.eos_token, hf.pad_token) == ("<|im_end|>", "<|endoftext|>")
    tok = Tokenizer.from_pretrained(default_model_dir)
    gen = json.loads((default_model_dir / "generation_config.json").read_text())
    assert set(tok.eos_token_ids) == set(gen["eos_token_id"]) == {
        hf.convert_tokens_to_ids("<|im_end|>"), hf.convert_tokens_to_ids("<|endoftext|>")}
    text = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert text == ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # common English words are single tokens (the BPE learned the corpus)
    assert len(tok.encode(" the")) == 1 and len(tok.encode(" cache")) == 1


@torch.no_grad()
def test_runs_in_transformers_and_is_not_uniform(default_model_dir):
    """transformers loads every tensor and runs the model; its next-token predictions on the
    corpus beat the uniform distribution by a wide margin (the bigram-fitted head) while random
    token order is predicted far worse."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(default_model_dir),
                                                       output_loading_info=True,
                                                       dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    model.eval()
    tok = Tokenizer.from_pretrained(default_model_dir)
    para = dm.CORPUS.split("\n\n")[4].replace("\n", " ")
    ids = torch.tensor([tok.encode(para)[:96]])

    def nll(x):
        logits = model(x).logits[0, :-1]
        return torch.nn.functional.cross_entropy(logits, x[0, 1:]).item()

    uniform = math.log(tok.vocab_size)
    g = torch.Generator().manual_seed(0)
    shuffled = ids[:, torch.randperm(ids.shape[1], generator=g)]
    assert nll(ids) < 0.5 * uniform
    assert nll(shuffled) > nll(ids) + 1.0
    out = model.generate(ids[:, :8], max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert out.shape[1] > 8
