"""Shared pytest fixtures: tiny random Hugging Face MoE checkpoints built locally (no downloads).

Checkpoints (session-scoped; each fixture returns the folder path):

- ``tiny_mixtral``            mixtral, 2 layers, 4 experts top-2, GQA 4 q / 2 kv heads of 16
- ``tiny_qwen3_moe``          qwen3_moe, 3 layers, 8 experts top-2 (normalised), GQA 4 q / 2 kv
                              heads of head_dim 32 (!= hidden/heads), q_norm/k_norm
- ``tiny_deepseek_v2``        deepseek_v2 MLA, 3 layers, q_lora_rank None, first_k_dense_replace=1,
                              n_shared_experts=1, greedy top-2 of 8, no rope scaling
- ``tiny_deepseek_v2_qlora``  deepseek_v2 MLA, q_lora_rank set, group_limited_greedy (n_group 4,
                              topk_group 2), routed_scaling_factor 2.5, YaRN (factor 4, original
                              512, mscale 0.9, mscale_all_dim 0.7); config.json written HUB-STYLE
- ``tiny_mixtral_hub``, ``tiny_qwen3_moe_hub``, ``tiny_deepseek_v2_hub``: the same weights as the
  first three, config.json rewritten with the older hub keys (``rope_theta``/``rope_scaling``,
  ``num_experts`` for qwen3_moe, ``torch_dtype``)
- ``tiny_qwen3_moe_sharded``  tiny_qwen3_moe saved in several shards with model.safetensors.index.json
- ``all_tiny``                parametrised over the four ``tiny_*`` architectures above
- ``all_hub``                 parametrised over the four hub-style configs
- ``default_model_dir``       the built-in default model built into a temp folder;
  ``writescope_cache`` points ``$WRITESCOPE_CACHE`` at an empty temp folder for one test
- ``bad_missing_tensor``, ``bad_wrong_shape``, ``bad_unknown_arch``: broken copies of
  tiny_qwen3_moe, returned as :class:`BadCheckpoint` (path, tensor, file)

The first three are written by transformers' ``save_pretrained`` (new ``rope_parameters`` keys,
per-expert hub tensor names). Hub-style folders are checked at build time: transformers loads
them (``AutoModelForCausalLM.from_pretrained``) and gives bit-identical logits to the model they
were made from, so transformers serves as the oracle for them too.

All are float32 and carry the default model's byte-level BPE tokenizer retrained to 320 tokens
(``writescope.models.default.write_tokenizer_files``), so ``generate(text)`` works;
``vocab_size`` = 320 = tokenizer size (a byte-level BPE cannot go below 259).

Weights are re-drawn from one seeded generator, larger than transformers' 0.02 init so that the
logits are far from flat (greedy decoding over 32+ tokens has clear top-1/top-2 gaps; see
tests/test_fixtures.py) and routers are decisive; RMSNorm weights are 1 + noise so a loader that
ignores them fails parity.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 320
TINY_MAX_POS = 2048
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

ARCHS = ("tiny_mixtral", "tiny_qwen3_moe", "tiny_deepseek_v2", "tiny_deepseek_v2_qlora")
HUB_ARCHS = ("tiny_mixtral_hub", "tiny_qwen3_moe_hub", "tiny_deepseek_v2_hub", "tiny_deepseek_v2_qlora")


@contextlib.contextmanager
def single_thread():
    """Run torch ops on one intra-op thread, restoring the previous count afterwards.

    Tiny models gain nothing from threads, and on a loaded 2-core machine OpenMP spin-waiting
    made a 48-token transformers ``generate`` 10-20x slower (8 s of CPU instead of 0.4 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


# ---------------------------------------------------------------------------------- configs
def tiny_config(arch: str, **overrides):
    """A transformers config object for one tiny architecture ('mixtral', 'qwen3_moe',
    'deepseek_v2', 'deepseek_v2_qlora')."""
    from transformers import DeepseekV2Config, MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=TINY_VOCAB, hidden_size=64, max_position_embeddings=TINY_MAX_POS,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=ENDOFTEXT_ID,
                  eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID)
    if arch == "mixtral":
        kw = dict(common, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6}, sliding_window=None)
        kw.update(overrides)
        return MixtralConfig(**kw)
    if arch == "qwen3_moe":
        kw = dict(common, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, intermediate_size=128, moe_intermediate_size=48, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                  mlp_only_layers=[], rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        kw.update(overrides)
        return Qwen3MoeConfig(**kw)
    mla = dict(common, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=128, moe_intermediate_size=32, kv_lora_rank=32,
               qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
               n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
               moe_layer_freq=1, norm_topk_prob=False, scoring_func="softmax")
    if arch == "deepseek_v2":
        kw = dict(mla, q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1,
                  routed_scaling_factor=1.0,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    elif arch == "deepseek_v2_qlora":
        kw = dict(mla, q_lora_rank=48, topk_method="group_limited_greedy", n_group=4,
                  topk_group=2, routed_scaling_factor=2.5,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 512, "beta_fast": 32,
                                   "beta_slow": 1, "mscale": 0.9, "mscale_all_dim": 0.7})
    else:
        raise ValueError(f"unknown tiny arch {arch!r}")
    kw.update(overrides)
    return DeepseekV2Config(**kw)


def _model_class(model_type: str):
    from transformers import DeepseekV2ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM

    return {"mixtral": MixtralForCausalLM, "qwen3_moe": Qwen3MoeForCausalLM,
            "deepseek_v2": DeepseekV2ForCausalLM}[model_type]


# ---------------------------------------------------------------------------------- weights
def _is_router(name: str) -> bool:
    return name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight")


@torch.no_grad()
def reinit_weights(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter from one seeded generator, in name order.

    Linear-like weights ~ N(0, 1/fan_in) (keeps activations O(1) through the residual stream);
    embeddings ~ N(0, 1); LM head ~ N(0, 4/fan_in) (logit spread ~2); routers ~ N(0, 9/fan_in)
    (routing decisive); norm weights ~ 1 + N(0, 0.1^2).
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.numel() == 0:  # (a DeepSeek-V2 with no shared experts: empty projections)
            continue
        r = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if p.dim() == 1:
            val = 1.0 + 0.1 * r if "norm" in name else 0.02 * r
        elif name.endswith("embed_tokens.weight"):
            val = r
        else:
            fan_in = p.shape[-1]
            gain = 2.0 if name.endswith("lm_head.weight") else 3.0 if _is_router(name) else 1.0
            val = r * (gain / math.sqrt(fan_in))
        p.copy_(val.to(p.dtype))


# ---------------------------------------------------------------------------------- builders
def _tokenizer_files(tmp_root: Path) -> Path:
    from writescope.models.default import write_tokenizer_files

    d = tmp_root / "_tokenizer"
    if not (d / "tokenizer.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        n = write_tokenizer_files(d, vocab_size=TINY_VOCAB, model_max_length=TINY_MAX_POS)
        assert n == TINY_VOCAB
    return d


def build_tiny_checkpoint(arch: str, dst: Path, seed: int = 0, tokenizer_dir: Path | None = None,
                          max_shard_size: str | None = None, generation_eos=None,
                          **overrides) -> Path:
    """Build a tiny random checkpoint of ``arch`` into ``dst`` with ``save_pretrained``."""
    cfg = tiny_config(arch, **overrides)
    with torch.random.fork_rng(devices=[]):  # model construction draws from the global RNG
        model = _model_class(cfg.model_type)(cfg)
    model = model.float().eval()
    reinit_weights(model, seed)
    dst.mkdir(parents=True, exist_ok=True)
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(dst, **kw)
    if generation_eos is not None:
        gen = json.loads((dst / "generation_config.json").read_text())
        gen["eos_token_id"] = generation_eos
        (dst / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True))
    if tokenizer_dir is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / f, dst / f)
    return dst


def to_hub_config(cfg: dict) -> dict:
    """Rewrite a transformers-5 ``config.json`` dict with the keys published hub checkpoints use:
    ``rope_theta`` + ``rope_scaling`` (``{"type": ...}`` or null) instead of ``rope_parameters``,
    ``torch_dtype`` instead of ``dtype``, ``num_experts`` for qwen3_moe, no derived head dims
    for deepseek_v2, no ``transformers_version``."""
    c = {k: v for k, v in cfg.items() if k not in ("transformers_version", "dtype", "rope_parameters")}
    c["torch_dtype"] = cfg.get("dtype", "float32")
    rp = dict(cfg.get("rope_parameters") or {})
    c["rope_theta"] = rp.pop("rope_theta", 10000.0)
    rtype = rp.pop("rope_type", "default")
    rp.pop("type", None)
    c["rope_scaling"] = None if rtype == "default" else {"type": rtype, **rp}
    mt = cfg["model_type"]
    if mt == "qwen3_moe" and "num_local_experts" in c:
        c["num_experts"] = c.pop("num_local_experts")
    if mt == "deepseek_v2":
        c.pop("head_dim", None)
        c.pop("qk_head_dim", None)
    if mt == "mixtral" and c.get("head_dim") is None:
        c.pop("head_dim", None)
    return c


def hf_model(path: str | Path, dtype: torch.dtype = torch.float32):
    """The transformers model of a checkpoint (the oracle): eval mode, eager attention and, where
    transformers has the choice, eager experts -- a loop of ``F.linear`` over the experts, not
    its ``grouped_mm`` kernel (which takes no float64, and whose CPU kernel is not the same on
    every host)."""
    from transformers import AutoModelForCausalLM, PretrainedConfig

    kw = dict(dtype=dtype, attn_implementation="eager")
    if hasattr(PretrainedConfig, "_experts_implementation"):
        kw["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(str(path), **kw).eval()


@torch.no_grad()
def _reference_logits(path: Path) -> torch.Tensor:
    ids = torch.arange(3, 3 + 40).remainder(TINY_VOCAB).unsqueeze(0)
    return hf_model(path)(ids).logits


def write_hub_checkpoint(src: Path, dst: Path, hub_config: dict | None = None,
                         check: bool = True) -> Path:
    """Copy checkpoint ``src`` to ``dst`` with a hub-style config.json (``to_hub_config`` of the
    source's, or ``hub_config`` as given) and, with ``check``, assert that transformers loads
    ``dst`` and computes the same logits as from ``src``."""
    shutil.copytree(src, dst)
    cfg = hub_config if hub_config is not None else to_hub_config(
        json.loads((src / "config.json").read_text()))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if check:
        with single_thread():
            a, b = _reference_logits(src), _reference_logits(dst)
        if not torch.equal(a, b):
            raise AssertionError(f"transformers gives different logits for the hub-style config "
                                 f"{dst} (max diff {(a - b).abs().max().item():.3g})")
    return dst


FP8_TEST_BLOCK = (16, 16)  # every tiny matrix dimension but DeepSeek's kv_a (40 rows) divides


def write_fp8_checkpoint(src: Path, dst: Path, block=FP8_TEST_BLOCK) -> Path:
    """``src`` re-saved in the block-wise FP8 format of the -FP8 releases: every linear layer's
    matrix (not the embeddings, the head or the routers) whose sides the block divides becomes
    ``float8_e4m3fn`` plus a float32 ``weight_scale_inv`` grid (``Fp8Blocks.quantize``: amax ->
    448); the others stay float32 and are named in ``modules_to_not_convert``, as the releases
    name their routers and heads."""
    from safetensors.torch import load_file, save_file

    from writescope.models.quantization import Fp8Blocks

    sch = Fp8Blocks(tuple(block))
    shutil.copytree(src, dst)
    sd = load_file(str(src / "model.safetensors"))
    out, keep = {}, []
    for n, t in sd.items():
        linear = (n.endswith(".weight") and t.dim() == 2 and not _is_router(n)
                  and "embed_tokens" not in n and not n.startswith("lm_head"))
        if linear and t.shape[0] % block[0] == 0 and t.shape[1] % block[1] == 0:
            out[n], out[n + "_scale_inv"] = sch.quantize(t)
        else:
            out[n] = t
            if linear:
                keep.append(n[:-len(".weight")])
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = dict(sch.to_hf(), modules_to_not_convert=["lm_head", *keep])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return dst


def hf_fp8_model(path: str | Path, dtype: torch.dtype = torch.float64):
    """transformers' model of an FP8 checkpoint, dequantized at load
    (``FineGrainedFP8Config(dequantize=True)``, which needs accelerate): the FP8 oracle."""
    pytest.importorskip("accelerate", reason="transformers loads FP8 checkpoints with accelerate")
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config, PretrainedConfig

    # loaded in float32 and then converted: its dequantization writes float32 whatever the dtype
    # asked for (q * scale in float32, as writescope's; exact in float64 afterwards)
    kw = dict(dtype=torch.float32, attn_implementation="eager",
              quantization_config=FineGrainedFP8Config(dequantize=True))
    if hasattr(PretrainedConfig, "_experts_implementation"):
        kw["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(str(path), **kw).to(dtype).eval()


@dataclass(frozen=True)
class BadCheckpoint:
    """A broken checkpoint folder; ``tensor``/``file`` name what is wrong (None if n/a)."""
    path: Path
    tensor: str | None
    file: str | None
    reason: str


def _rewrite_safetensors(src_file: Path, dst_file: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(src_file))
    edit(sd)
    save_file(sd, str(dst_file), metadata={"format": "pt"})


@contextlib.contextmanager
def in_process_server(engine, **client_options):
    """writescope's OpenAI app over ``engine``, in this process, behind starlette's TestClient
    (its lifespan started: the engine loop runs); ``client_options`` go to the TestClient."""
    from starlette.testclient import TestClient
    from writescope.server.api import create_app
    with TestClient(create_app(engine), **client_options) as client:
        yield client


def chat_engine(path, template: str, **options):
    """An ``LLMEngine`` over the checkpoint at ``path`` (float32 on the CPU, 512 positions,
    unless ``options`` say otherwise) whose tokenizer renders chats with ``template``."""
    from writescope.engine.engine import LLMEngine
    eng = LLMEngine(str(path), **{**dict(dtype="float32", device="cpu", max_model_len=512),
                                  **options})
    eng.tokenizer.hf.chat_template = template
    return eng


def abort_left(request, names=("prio", "fcfs")) -> None:
    """Abort whatever is left in the engines of the ``LLM`` fixtures ``names`` that the test
    used (an autouse fixture's teardown): a failing test's requests do not stay queued in the
    shared engines for the next."""
    for name in names:
        if name in request.fixturenames:
            eng = request.getfixturevalue(name).llm_engine
            eng.abort_request(list(eng.requests) + list(eng.fanout.parents))


def post_ok(client, path: str, **body) -> dict:
    """POST ``body`` as JSON; the answer's JSON, after checking it is a 200."""
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_ckpts")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tiny_root) -> Path:
    """tokenizer.json + tokenizer_config.json of 320 tokens (ChatML specials 0, 1, 2)."""
    return _tokenizer_files(tiny_root)


@pytest.fixture(scope="session")
def tiny_mixtral(tiny_root, tiny_tokenizer_dir) -> Path:
    return build_tiny_checkpoint("mixtral", tiny_root / "mixtral", seed=1,
                                 tokenizer_dir=tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tiny_root, tiny_tokenizer_dir) -> Path:
    return build_tiny_checkpoint("qwen3_moe", tiny_root / "qwen3_moe", seed=2,
                                 tokenizer_dir=tiny_tokenizer_dir,
                                 generation_eos=[IM_END_ID, ENDOFTEXT_ID])


@pytest.fixture(scope="session")
def tiny_qwen3_moe_sharded(tiny_root, tiny_tokenizer_dir) -> Path:
    """The same weights as tiny_qwen3_moe, in several safetensors shards plus an index."""
    return build_tiny_checkpoint("qwen3_moe", tiny_root / "qwen3_moe_sharded", seed=2,
                                 tokenizer_dir=tiny_tokenizer_dir, max_shard_size="200KB",
                                 generation_eos=[IM_END_ID, ENDOFTEXT_ID])


@pytest.fixture(scope="session")
def tiny_deepseek_v2(tiny_root, tiny_tokenizer_dir) -> Path:
    return build_tiny_checkpoint("deepseek_v2", tiny_root / "deepseek_v2", seed=3,
                                 tokenizer_dir=tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_deepseek_v2_qlora(tiny_root, tiny_tokenizer_dir) -> Path:
    """Hub-style config.json (rope_theta + rope_scaling {"type": "yarn", ...}), checked against
    the transformers-5 config it was converted from."""
    src = build_tiny_checkpoint("deepseek_v2_qlora", tiny_root / "_deepseek_v2_qlora_src", seed=4,
                                tokenizer_dir=tiny_tokenizer_dir)
    return write_hub_checkpoint(src, tiny_root / "deepseek_v2_qlora")


@pytest.fixture(scope="session")
def tiny_mixtral_hub(tiny_root, tiny_mixtral) -> Path:
    return write_hub_checkpoint(tiny_mixtral, tiny_root / "mixtral_hub")


@pytest.fixture(scope="session")
def tiny_qwen3_moe_hub(tiny_root, tiny_qwen3_moe) -> Path:
    return write_hub_checkpoint(tiny_qwen3_moe, tiny_root / "qwen3_moe_hub")


@pytest.fixture(scope="session")
def tiny_deepseek_v2_hub(tiny_root, tiny_deepseek_v2) -> Path:
    return write_hub_checkpoint(tiny_deepseek_v2, tiny_root / "deepseek_v2_hub")


@pytest.fixture(scope="session")
def tiny_qwen3_moe_fp8(tiny_root, tiny_qwen3_moe) -> Path:
    return write_fp8_checkpoint(tiny_qwen3_moe, tiny_root / "qwen3_moe_fp8")


@pytest.fixture(scope="session")
def tiny_mixtral_fp8(tiny_root, tiny_mixtral) -> Path:
    return write_fp8_checkpoint(tiny_mixtral, tiny_root / "mixtral_fp8")


@pytest.fixture(scope="session")
def tiny_deepseek_v2_fp8(tiny_root, tiny_deepseek_v2) -> Path:
    return write_fp8_checkpoint(tiny_deepseek_v2, tiny_root / "deepseek_v2_fp8")


FP8_ARCHS = ("tiny_mixtral_fp8", "tiny_qwen3_moe_fp8", "tiny_deepseek_v2_fp8")


@pytest.fixture(params=FP8_ARCHS)
def all_fp8(request) -> Path:
    """Each tiny architecture's FP8 checkpoint in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def torch_single_thread():
    """Use in tests that run transformers models (see ``single_thread``)."""
    with single_thread():
        yield


@pytest.fixture(params=ARCHS)
def all_tiny(request) -> Path:
    """Each tiny architecture in turn (test ids: tiny_mixtral, tiny_qwen3_moe, ...)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(params=HUB_ARCHS)
def all_hub(request) -> Path:
    """Each hub-style (old-key) config.json checkpoint in turn."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory) -> Path:
    """The built-in default model, built into a temporary folder (not the user's cache)."""
    from writescope.models.default import build_default_model

    return build_default_model(tmp_path_factory.mktemp("default_model") / "default-moe")


@pytest.fixture
def writescope_cache(tmp_path, monkeypatch) -> Path:
    """An empty ``$WRITESCOPE_CACHE`` for one test (``default_model_path()`` builds there)."""
    d = tmp_path / "ws_cache"
    monkeypatch.setenv("WRITESCOPE_CACHE", str(d))
    return d


MISSING_TENSOR = "model.layers.1.mlp.experts.3.down_proj.weight"
WRONG_SHAPE_TENSOR = "model.layers.0.self_attn.k_proj.weight"


@pytest.fixture(scope="session")
def bad_missing_tensor(tiny_root, tiny_qwen3_moe) -> BadCheckpoint:
    """tiny_qwen3_moe without one routed-expert tensor."""
    dst = tiny_root / "bad_missing_tensor"
    shutil.copytree(tiny_qwen3_moe, dst)
    _rewrite_safetensors(tiny_qwen3_moe / "model.safetensors", dst / "model.safetensors",
                         lambda sd: sd.pop(MISSING_TENSOR))
    return BadCheckpoint(dst, MISSING_TENSOR, "model.safetensors", "missing tensor")


@pytest.fixture(scope="session")
def bad_wrong_shape(tiny_root, tiny_qwen3_moe) -> BadCheckpoint:
    """tiny_qwen3_moe with k_proj of layer 0 one output row short ([63, 64] instead of [64, 64])."""
    dst = tiny_root / "bad_wrong_shape"
    shutil.copytree(tiny_qwen3_moe, dst)

    def edit(sd):
        sd[WRONG_SHAPE_TENSOR] = sd[WRONG_SHAPE_TENSOR][:-1].clone()

    _rewrite_safetensors(tiny_qwen3_moe / "model.safetensors", dst / "model.safetensors", edit)
    return BadCheckpoint(dst, WRONG_SHAPE_TENSOR, "model.safetensors", "wrong shape")


@pytest.fixture(scope="session")
def bad_unknown_arch(tiny_root, tiny_qwen3_moe) -> BadCheckpoint:
    """tiny_qwen3_moe whose config.json says model_type "unknown_arch"."""
    dst = tiny_root / "bad_unknown_arch"
    shutil.copytree(tiny_qwen3_moe, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_type"] = "unknown_arch"
    cfg["architectures"] = ["UnknownArchForCausalLM"]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return BadCheckpoint(dst, None, "config.json", "unknown model_type")
