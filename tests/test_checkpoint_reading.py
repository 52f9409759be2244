"""What a checkpoint leaves unsaid, read as transformers and vLLM read it: config.json fields
left out take transformers' defaults for the model type; a tokenizer.json without a
tokenizer_config.json is loaded; generation_config.json's sampling defaults apply to requests
that give none (vLLM's generation_config="auto"), and its extra EOS ids end outputs with a
``stop_reason`` (vLLM's stop_token_ids)."""
from __future__ import annotations

import json
import shutil

import pytest

from conftest import ENDOFTEXT_ID, IM_END_ID, build_tiny_checkpoint, tiny_config
from writescope import LLM, SamplingParams
from writescope.models.config import ModelConfig

PROMPT = [42, 71, 286, 81, 266, 277, 311, 14, 262]


def _dict(arch: str, drop: tuple, **kw) -> dict:
    d = tiny_config(arch, **kw).to_dict()
    for k in drop:
        d.pop(k, None)
    d.pop("rope_parameters", None) if "rope_theta" in drop else None
    return d


def test_fields_left_out_take_transformers_defaults():
    from transformers import AutoConfig
    m = ModelConfig.from_hf(_dict("mixtral", ("rope_theta", "max_position_embeddings")))
    hf = AutoConfig.for_model("mixtral")
    assert m.rope_theta == 1e6 == hf.rope_parameters["rope_theta"]
    assert m.max_position_embeddings == hf.max_position_embeddings
    m = ModelConfig.from_hf(_dict("mixtral", ("num_key_value_heads",), num_attention_heads=8))
    assert m.num_kv_heads == hf.num_key_value_heads == 8
    q = ModelConfig.from_hf(_dict("qwen3_moe", ("max_position_embeddings",)))
    assert q.max_position_embeddings == 32768
    dd = _dict("deepseek_v2", ("q_lora_rank", "n_shared_experts"))
    d = ModelConfig.from_hf(dd)
    assert d.q_lora_rank == 1536 and d.num_shared_experts == 2
    dd["q_lora_rank"] = None  # said null (DeepSeek-V2-Lite's): no query compression
    assert ModelConfig.from_hf(dd).q_lora_rank is None


@pytest.fixture(scope="module")
def generated(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny Qwen3-MoE with a tokenizer.json only and a generation config that sets sampling
    defaults and two EOS ids (the tokenizer's own, 2, and 172)."""
    root = tmp_path_factory.mktemp("gen")
    d = build_tiny_checkpoint("qwen3_moe", root / "m", seed=2, generation_eos=[2, 172])
    shutil.copy(tiny_tokenizer_dir / "tokenizer.json", d / "tokenizer.json")
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(temperature=0.3, top_p=0.9, top_k=7, repetition_penalty=1.05, max_new_tokens=5)
    (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def _llm(path, **kw):
    return LLM(str(path), dtype="float32", device="cpu", max_model_len=256, kv_policy="cpu", **kw)


def test_a_tokenizer_json_alone_is_loaded(generated):
    from transformers import AutoTokenizer
    llm = _llm(generated)
    assert llm.tokenizer is not None
    want = AutoTokenizer.from_pretrained(str(generated))("once upon a time").input_ids
    assert llm.tokenizer.encode("once upon a time") == want


def test_generation_config_sampling_defaults(generated, tiny_qwen3_moe):
    llm = _llm(generated)
    p = llm.get_default_sampling_params()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (
        0.3, 0.9, 7, 1.05, 5)
    out = llm.generate([PROMPT] * 3)  # no parameters: the model's defaults
    assert all(1 <= len(o.token_ids) <= 5 for o in out)
    plain = _llm(generated, generation_config="vllm").get_default_sampling_params()
    assert plain == SamplingParams()
    own = _llm(generated, generation_config=str(tiny_qwen3_moe)).get_default_sampling_params()
    assert own == SamplingParams()  # that folder's generation_config.json sets no sampling
    with pytest.raises(ValueError, match="generation_config"):
        _llm(generated, generation_config=str(generated / "nowhere"))


def test_the_server_fills_what_a_request_leaves_out():
    from writescope.server import protocol as P
    defaults = {"temperature": 0.3, "top_p": 0.9, "top_k": 7, "repetition_penalty": 1.05}
    req = P.CompletionRequest(prompt="x", top_p=0.5)
    sp = req.sampling_params(16, None, defaults=defaults)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.repetition_penalty) == (0.3, 0.5, 7, 1.05)
    sp = P.CompletionRequest(prompt="x", spaces_between_special_tokens=False).sampling_params(
        16, None)
    assert (sp.temperature, sp.top_p, sp.top_k) == (1.0, 1.0, -1)
    assert sp.spaces_between_special_tokens is False  # vLLM's field, accepted


def test_an_extra_eos_id_is_named_as_the_stop_reason(generated):
    """Each EOS id ends the output; the tokenizer's own gives no stop_reason, another (from
    generation_config.json) is named, as vLLM's stop_token_ids."""
    llm = _llm(generated)
    own = llm.tokenizer.hf.eos_token_id
    assert llm.engine.model_eos_id == own and 172 in llm.engine.eos_ids and own != 172
    base = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert base.stop_reason is None and base.finish_reason == "length"
    for tok in sorted(llm.engine.eos_ids):
        o = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8,
                                                  logit_bias={tok: 100.0}))[0]
        assert o.token_ids == [tok] and o.finish_reason == "stop"
        assert o.stop_reason == (None if tok == own else tok)


@pytest.mark.parametrize("form", ["bin", "bin-sharded", "unindexed"])
def test_bin_and_unindexed_weights_load_as_vllm_loads_them(tmp_path, tiny_qwen3_moe, form):
    """PyTorch .bin state dicts (one file, or shards with pytorch_model.bin.index.json) and
    safetensors files without an index give the safetensors checkpoint's tokens."""
    import torch
    from safetensors.torch import load_file
    d = tmp_path / form
    shutil.copytree(tiny_qwen3_moe, d)
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    if form == "bin":
        torch.save(sd, d / "pytorch_model.bin")
    elif form == "bin-sharded":
        names = sorted(sd)
        halves = {"pytorch_model-00001-of-00002.bin": names[::2],
                  "pytorch_model-00002-of-00002.bin": names[1::2]}
        for f, ns in halves.items():
            torch.save({n: sd[n] for n in ns}, d / f)
        (d / "pytorch_model.bin.index.json").write_text(json.dumps(
            {"weight_map": {n: f for f, ns in halves.items() for n in ns}}))
    else:
        from safetensors.torch import save_file
        save_file(sd, str(d / "model-00001-of-00001.safetensors"))
    g = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = _llm(tiny_qwen3_moe).generate([PROMPT], g)[0].token_ids
    assert _llm(d).generate([PROMPT], g)[0].token_ids == want


def test_a_folder_without_weights_is_named(tmp_path, tiny_qwen3_moe):
    d = tmp_path / "empty"
    d.mkdir()
    shutil.copy(tiny_qwen3_moe / "config.json", d / "config.json")
    with pytest.raises(ValueError, match="no weights in"):
        _llm(d)


def test_dtype_auto_and_a_tokenizer_folder(tmp_path, tiny_qwen3_moe, tiny_tokenizer_dir):
    """vLLM's ``dtype="auto"`` (the checkpoint's own 16-bit dtype, else bfloat16) and
    ``tokenizer=`` (another folder's tokenizer)."""
    import torch
    from writescope.engine.model_source import parse_dtype
    assert parse_dtype("auto", {"torch_dtype": "float16"}) == torch.float16
    assert parse_dtype("auto", {"dtype": "bfloat16"}) == torch.bfloat16
    assert parse_dtype("auto", {"torch_dtype": "float32"}) == torch.bfloat16
    assert parse_dtype("auto", {}) == torch.bfloat16
    with pytest.raises(ValueError, match="or auto"):
        parse_dtype("float8")
    d = tmp_path / "bare"
    shutil.copytree(tiny_qwen3_moe, d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    llm = LLM(str(d), dtype="auto", device="cpu", max_model_len=256, kv_policy="cpu",
              tokenizer=str(tiny_tokenizer_dir))
    assert llm.engine.dtype == torch.bfloat16  # saved float32
    assert llm.tokenizer.encode("once upon") == _llm(tiny_qwen3_moe).tokenizer.encode("once upon")
    # the model folder's generation_config.json names the EOS ids, not the tokenizer's folder
    assert not (tiny_tokenizer_dir / "generation_config.json").exists()
    assert llm.engine.eos_ids == _llm(tiny_qwen3_moe).engine.eos_ids == {IM_END_ID, ENDOFTEXT_ID}
    with pytest.raises(ValueError, match="no tokenizer in"):
        LLM(str(d), device="cpu", max_model_len=256, tokenizer=str(tmp_path))


def test_the_server_takes_the_models_defaults(generated):
    """A completion request that sets no temperature or max_tokens samples with the model's
    defaults: generation_config.json's max_new_tokens (5) bounds it, and its stop_reason is
    null unless a stop token or string ended it."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient
    from writescope.engine.engine import LLMEngine
    from writescope.server.api import create_app
    eng = LLMEngine(str(generated), dtype="float32", device="cpu", max_model_len=256)
    with TestClient(create_app(eng)) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": None, "seed": 3})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert r.json()["usage"]["completion_tokens"] <= 5 and "stop_reason" in ch
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "stop": ["a"],
                                            "temperature": 0, "ignore_eos": True})
        ch = r.json()["choices"][0]
        assert ch["stop_reason"] == ("a" if ch["finish_reason"] == "stop" else None)
