"""``ModelConfig.from_hf``: one normalised view of Hugging Face MoE configs.

Field names differ across families and across transformers versions (``num_local_experts`` vs
``num_experts`` vs ``n_routed_experts``; ``rope_theta``/``rope_scaling`` vs ``rope_parameters``).
Everything downstream reads this dataclass only.
"""
from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..kvcache.regions import KVSpec
from .quantization import Fp8Blocks, quantization_from_hf

SUPPORTED = ("mixtral", "qwen3_moe", "deepseek_v2")
REFERENCE_DIR = Path(__file__).parent / "configs"
#: short names accepted wherever a checkpoint path is
REFERENCE_MODELS = {
    "deepseek-v2-lite": "deepseek-v2-lite.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "mixtral-8x7b": "mixtral-8x7b.json",
}


class ConfigError(ValueError):
    """A config.json that writescope cannot run: unsupported model_type or a missing field."""


def _req(d: dict, *names: str, what: str | None = None) -> Any:
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    raise ConfigError(f"config.json ({d.get('model_type', '?')}) is missing required field "
                      f"{what or names[0]!r}")


#: integer fields and the least value each may have, checked before any is used (a config
#: override may set any value: ``--config-override decoder_sparse_step=0``)
_INT_FIELDS = {
    "vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "num_attention_heads": 1,
    "num_key_value_heads": 1, "head_dim": 1, "intermediate_size": 1,
    "moe_intermediate_size": 1, "max_position_embeddings": 1, "num_experts_per_tok": 1,
    "num_experts": 0, "num_local_experts": 0, "n_routed_experts": 1, "decoder_sparse_step": 1,
    "first_k_dense_replace": 0, "moe_layer_freq": 1, "n_shared_experts": 0, "n_group": 1,
    "topk_group": 1, "q_lora_rank": 1, "kv_lora_rank": 1, "qk_nope_head_dim": 1,
    "qk_rope_head_dim": 1, "v_head_dim": 1,
}


#: optional fields a config.json may leave out, which then take transformers' defaults for its
#: model type (``MixtralConfig``'s ``rope_theta`` 1e6 and 8 KV heads, ``DeepseekV2Config``'s
#: ``q_lora_rank`` 1536 and 2 shared experts, ...): the model transformers and vLLM build
_DEFAULTED = ("max_position_embeddings", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "tie_word_embeddings", "attention_bias", "norm_topk_prob", "decoder_sparse_step",
              "mlp_only_layers", "use_sliding_window", "sliding_window", "first_k_dense_replace",
              "n_shared_experts", "routed_scaling_factor", "n_group", "topk_group",
              "topk_method", "scoring_func", "q_lora_rank", "hidden_act")


@functools.lru_cache(maxsize=None)
def _hf_defaults(model_type: str) -> dict:
    """transformers' defaults for :data:`_DEFAULTED` and ``rope_theta`` ({} where its config
    class cannot be made)."""
    try:
        from transformers import AutoConfig
        c = AutoConfig.for_model(model_type).to_dict()
    except Exception:  # noqa: BLE001 - an older transformers: writescope's own defaults
        return {}
    out = {k: c[k] for k in _DEFAULTED if c.get(k) is not None}
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        out["rope_theta"] = theta
    return out


def _with_hf_defaults(d: dict) -> dict:
    """``d`` with transformers' defaults for the optional fields it leaves out."""
    out = dict(d)
    for k, v in _hf_defaults(d["model_type"]).items():
        if k == "rope_theta" and "rope_parameters" in d:
            continue  # the rotation's own dict says (and defaults) its theta
        out.setdefault(k, v)
    return out


def _check_ints(d: dict) -> None:
    for name, least in _INT_FIELDS.items():
        v = d.get(name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            kind = "a positive integer" if least else "an integer of at least 0"
            raise ConfigError(f"{name} must be {kind}, got {v!r}")
    for name in ("rms_norm_eps", "rope_theta", "routed_scaling_factor"):
        v = d.get(name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                              or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"{name} must be a positive number, got {v!r}")
    for name in ("rope_parameters", "rope_scaling"):
        v = d.get(name)
        if v is not None and not isinstance(v, dict):
            raise ConfigError(f"{name} must be an object or null, got {v!r}")
    layers = d.get("mlp_only_layers")
    if layers is not None and not (isinstance(layers, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise ConfigError(f"mlp_only_layers must be a list of layer indices, got {layers!r}")


def _opt(d: dict, name: str, default: Any) -> Any:
    v = d.get(name)
    return default if v is None else v


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP (DeepSeek's first_k_dense_replace layers)
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    #: sliding-window attention's window (Mixtral's ``sliding_window``; Qwen3's when
    #: ``use_sliding_window``), or None: the engine runs full attention, so it runs a windowed
    #: model only up to the window, where the two are the same
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    norm_topk_prob: bool = False
    # MoE details
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead of MoE
    # attention details
    attention_bias: bool = False
    qk_norm: bool = False
    # MLA (deepseek_v2)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    #: block-wise FP8 weights (``models/quantization.py``); None for an unquantized checkpoint
    quantization: Fp8Blocks | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf(cls, source: str | Path | dict) -> "ModelConfig":
        """From a checkpoint folder, a config.json path, a reference name or a dict."""
        cfg = cls._from_dict(load_config_dict(source))
        cfg._check_sizes()
        return cfg

    def _check_sizes(self) -> None:
        """Sizes a model can be built with (a config override may set any number)."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_position_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok must be from 1 to the {self.num_experts} "
                              f"experts, got {self.num_experts_per_tok!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                              f"num_key_value_heads ({self.num_kv_heads})")

    @classmethod
    def _from_dict(cls, d: dict) -> "ModelConfig":
        """:meth:`from_hf` on a loaded config.json."""
        mt = d.get("model_type")
        if mt not in SUPPORTED:
            raise ConfigError(f"unsupported model_type {mt!r}; writescope runs {', '.join(SUPPORTED)}")
        d = _with_hf_defaults(d)
        _check_ints(d)
        act = d.get("hidden_act", "silu")
        if act != "silu":  # every MLP and expert kernel here computes silu(gate) * up
            raise ConfigError(f"hidden_act {act!r} is not supported (silu only)")
        rope_theta, rope_scaling = _rope(d)
        eos = d.get("eos_token_id")
        eos = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
        common = dict(
            model_type=mt,
            vocab_size=_req(d, "vocab_size"),
            hidden_size=_req(d, "hidden_size"),
            num_layers=_req(d, "num_hidden_layers"),
            num_heads=_req(d, "num_attention_heads"),
            rms_norm_eps=float(_req(d, "rms_norm_eps")),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(_opt(d, "max_position_embeddings", 4096)),
            tie_word_embeddings=bool(_opt(d, "tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            quantization=quantization_from_hf(d.get("quantization_config")),
            raw=d,
        )
        num_layers = common["num_layers"]
        if mt == "mixtral":
            num_heads = common["num_heads"]
            return cls(**common, sliding_window=_window(d.get("sliding_window")),
                       num_kv_heads=_opt(d, "num_key_value_heads", num_heads),
                       head_dim=_opt(d, "head_dim", common["hidden_size"] // num_heads),
                       intermediate_size=_req(d, "intermediate_size"),
                       moe_intermediate_size=_req(d, "intermediate_size"),
                       num_experts=_req(d, "num_local_experts", "num_experts", what="num_local_experts"),
                       num_experts_per_tok=_req(d, "num_experts_per_tok"),
                       norm_topk_prob=True)
        if mt == "qwen3_moe":
            num_heads = common["num_heads"]
            step = _opt(d, "decoder_sparse_step", 1)
            mlp_only = set(_opt(d, "mlp_only_layers", []))
            n_exp = _req(d, "num_experts", "num_local_experts", what="num_experts")
            dense = tuple(i for i in range(num_layers)
                          if i in mlp_only or not (n_exp > 0 and (i + 1) % step == 0))
            window = d.get("sliding_window") if d.get("use_sliding_window") else None
            return cls(**common, sliding_window=_window(window),
                       num_kv_heads=_opt(d, "num_key_value_heads", num_heads),
                       head_dim=_opt(d, "head_dim", common["hidden_size"] // num_heads),
                       intermediate_size=_req(d, "intermediate_size"),
                       moe_intermediate_size=_req(d, "moe_intermediate_size"),
                       num_experts=n_exp,
                       num_experts_per_tok=_req(d, "num_experts_per_tok"),
                       norm_topk_prob=bool(_opt(d, "norm_topk_prob", False)),
                       attention_bias=bool(_opt(d, "attention_bias", False)),
                       qk_norm=True,
                       dense_layers=dense)
        # deepseek_v2
        # as transformers' deepseek_v2: every layer from first_k_dense_replace on is MoE
        # (``moe_layer_freq`` is not read there; the released checkpoints set it to 1)
        first_dense = _opt(d, "first_k_dense_replace", 0)
        if _opt(d, "moe_layer_freq", 1) != 1:
            warnings.warn(f"deepseek_v2 moe_layer_freq {d['moe_layer_freq']!r} is not read, as in "
                          "transformers: every layer from first_k_dense_replace on is MoE",
                          stacklevel=3)
        if _opt(d, "norm_topk_prob", False):
            warnings.warn("deepseek_v2 norm_topk_prob is not read, as in transformers: the top-k "
                          "weights are scaled by routed_scaling_factor, not normalised",
                          stacklevel=3)
        n_exp = _req(d, "n_routed_experts")
        dense = tuple(range(min(first_dense, num_layers)))
        n_shared = _opt(d, "n_shared_experts", 0)
        moe_inter = _req(d, "moe_intermediate_size")
        scoring = _opt(d, "scoring_func", "softmax")
        if scoring != "softmax":
            raise ConfigError(f"deepseek_v2 scoring_func {scoring!r} is not supported (softmax only)")
        method = _opt(d, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ConfigError(f"deepseek_v2 topk_method {method!r} is not supported "
                              "(greedy, group_limited_greedy)")
        return cls(**common,
                   num_kv_heads=1,
                   head_dim=_req(d, "qk_nope_head_dim") + _req(d, "qk_rope_head_dim"),
                   intermediate_size=_req(d, "intermediate_size"),
                   moe_intermediate_size=moe_inter,
                   num_experts=n_exp,
                   num_experts_per_tok=_req(d, "num_experts_per_tok"),
                   # transformers' deepseek_v2 never normalises the top-k weights (it scales
                   # them by routed_scaling_factor) whatever norm_topk_prob says; DeepSeek's own
                   # V2 code normalises *instead of* scaling when it is set. The released
                   # checkpoints set it false, where all agree; writescope follows transformers.
                   norm_topk_prob=False,
                   num_shared_experts=n_shared,
                   shared_expert_intermediate_size=moe_inter * n_shared,
                   routed_scaling_factor=float(_opt(d, "routed_scaling_factor", 1.0)),
                   topk_method=method,
                   n_group=int(_opt(d, "n_group", 1)),
                   topk_group=int(_opt(d, "topk_group", 1)),
                   dense_layers=dense,
                   attention_bias=bool(_opt(d, "attention_bias", False)),
                   q_lora_rank=d.get("q_lora_rank"),
                   kv_lora_rank=_req(d, "kv_lora_rank"),
                   qk_nope_head_dim=_req(d, "qk_nope_head_dim"),
                   qk_rope_head_dim=_req(d, "qk_rope_head_dim"),
                   v_head_dim=_req(d, "v_head_dim"))

    # ------------------------------------------------------------------ derived facts
    @property
    def is_mla(self) -> bool:
        return self.model_type == "deepseek_v2"

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if i not in set(self.dense_layers))

    def kv_spec(self, dtype: torch.dtype) -> KVSpec:
        if self.is_mla:
            return KVSpec.mla(self.num_layers, self.kv_lora_rank, self.qk_rope_head_dim, dtype)
        return KVSpec.gqa(self.num_layers, self.num_kv_heads, self.head_dim, dtype)

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.kv_spec(dtype).token_bytes()

    @property
    def softmax_scale(self) -> float:
        """The attention scale, including DeepSeek's YaRN mscale correction."""
        if not self.is_mla:
            return self.head_dim ** -0.5
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        rs = self.rope_scaling or {}
        if rs.get("rope_type", rs.get("type")) == "yarn":
            mall = rs.get("mscale_all_dim", 0) or 0
            if mall:
                m = yarn_get_mscale(rs["factor"], mall)
                scale = scale * m * m
        return scale

    @property
    def max_positions(self) -> int:
        """The longest sequence the model was made for, derived as vLLM derives its default
        ``max_model_len``: ``max_position_embeddings``; with YaRN, the rotation's
        ``original_max_position_embeddings`` times its ``factor``; with linear scaling,
        ``max_position_embeddings`` times the factor. (A Qwen3 checkpoint whose config gains
        Qwen's YaRN block, factor 4 over 32,768, runs 131,072 tokens, as under vLLM.)"""
        rs = self.rope_scaling or {}
        rtype = rs.get("rope_type", rs.get("type", "default"))
        factor = rs.get("factor")
        if rtype == "yarn" and factor:
            orig = rs.get("original_max_position_embeddings") or self.max_position_embeddings
            return int(orig * float(factor))
        if rtype == "linear" and factor:
            return int(self.max_position_embeddings * float(factor))
        return int(self.max_position_embeddings)

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    def param_counts(self) -> dict[str, int]:
        """Parameter counts: routed experts and everything else (for placement and planning)."""
        h, v = self.hidden_size, self.vocab_size
        embed = v * h * (1 if self.tie_word_embeddings else 2)
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.num_heads * qk if self.q_lora_rank is None else
                 h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk)
            attn = (q + h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                    + self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
                    + self.num_heads * self.v_head_dim * h)
        else:
            d = self.head_dim
            attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
            if self.qk_norm:
                attn += 2 * d
        expert = 3 * h * self.moe_intermediate_size
        n_moe = len(self.moe_layers)
        routed = n_moe * self.num_experts * expert
        per_layer_other = attn + 2 * h
        shared = n_moe * (3 * h * self.shared_expert_intermediate_size + h * self.num_experts)
        dense = len(self.dense_layers) * 3 * h * self.intermediate_size
        other = embed + h + self.num_layers * per_layer_other + shared + dense
        return {"routed_experts": routed, "other": other, "total": routed + other,
                "expert": expert}


def _window(w) -> int | None:
    if w is None:
        return None
    if not isinstance(w, int) or isinstance(w, bool) or w < 1:
        raise ConfigError(f"sliding_window must be a positive integer or null, got {w!r}")
    return w


def _rope(d: dict) -> tuple[float, dict | None]:
    """(theta, scaling dict or None) from either the old keys or ``rope_parameters``; a YaRN
    dict gets transformers' defaults for what it leaves out (``original_max_position_embeddings``:
    ``max_position_embeddings``; ``factor``: the ratio of the two)."""
    theta, rs = _rope_keys(d)
    if rs is not None and rs.get("rope_type") == "yarn":
        mpe = d.get("max_position_embeddings") or 4096
        if not rs.get("original_max_position_embeddings"):
            rs["original_max_position_embeddings"] = mpe
        if rs.get("factor") is None:
            rs["factor"] = mpe / rs["original_max_position_embeddings"]
    return theta, rs


def _rope_keys(d: dict) -> tuple[float, dict | None]:
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and rp:
        # per-layer-type dicts ({"full_attention": {...}}) are not used by these families
        if "rope_theta" not in rp and len(rp) == 1 and isinstance(next(iter(rp.values())), dict):
            rp = next(iter(rp.values()))
        theta = rp.get("rope_theta", d.get("rope_theta", 10000.0))
        rtype = rp.get("rope_type", rp.get("type", "default"))
        scaling = None if rtype == "default" else {
            k: v for k, v in rp.items() if k not in ("rope_theta", "type", "rope_type")}
        if scaling is not None:
            scaling["rope_type"] = rtype
        return theta, scaling
    theta = d.get("rope_theta", 10000.0)
    rs = d.get("rope_scaling")
    if rs:
        rs = dict(rs)
        rtype = rs.pop("rope_type", None) or rs.pop("type", "default")
        rs.pop("type", None)
        rs["rope_type"] = rtype
        if rtype == "default":
            rs = None
    return theta, rs or None


def load_config_dict(source: str | Path | dict) -> dict:
    if isinstance(source, dict):
        return dict(source)
    s = str(source)
    if s in REFERENCE_MODELS:
        return json.loads((REFERENCE_DIR / REFERENCE_MODELS[s]).read_text())
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        names = ", ".join(REFERENCE_MODELS)
        raise ConfigError(f"no config.json at {p} (and {s!r} is not one of the reference models: {names})")
    try:
        d = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p} is not valid JSON: {e}") from e
    if not isinstance(d, dict):
        raise ConfigError(f"{p} is not a JSON object")
    return d
