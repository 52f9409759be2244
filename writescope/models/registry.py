"""model_type -> model class."""
from __future__ import annotations

from .base import CausalLM
from .config import ConfigError, ModelConfig
from .deepseek_v2 import DeepseekV2ForCausalLM
from .mixtral import MixtralForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM

MODELS: dict[str, type[CausalLM]] = {
    "mixtral": MixtralForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "deepseek_v2": DeepseekV2ForCausalLM,
}


def model_class(cfg: ModelConfig) -> type[CausalLM]:
    try:
        return MODELS[cfg.model_type]
    except KeyError:
        raise ConfigError(f"unsupported model_type {cfg.model_type!r}") from None
