"""Which model an engine builds: a reference name (random weights) or a checkpoint folder,
its config.json normalised (:class:`~writescope.models.config.ModelConfig`) with any overrides,
and the dtype names the API and CLI accept."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..models.config import REFERENCE_MODELS, ModelConfig

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "half": torch.float16, "float32": torch.float32,
          "fp32": torch.float32, "float": torch.float32}


def parse_dtype(dtype: str | torch.dtype, config: dict | None = None) -> torch.dtype:
    """A dtype name; ``"auto"`` (vLLM's): the checkpoint's own (config.json's ``dtype`` or
    ``torch_dtype``) when it is 16-bit, else bfloat16 -- float32 and unsaid included, as vLLM
    does not run a float32 checkpoint in float32 unless asked."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype).lower() == "auto":
        saved = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
        got = DTYPES.get(str(saved).lower().replace("torch.", ""))
        return got if got in (torch.bfloat16, torch.float16) else torch.bfloat16
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)} or "
                         "auto") from None


#: config.json keys an override may add (absent from some families' configs; a
#: ``quantization_config`` gives random weights the FP8 experts of an -FP8 release)
OVERRIDE_NEW_KEYS = ("head_dim", "quantization_config")


def apply_config_overrides(raw: dict, overrides: dict | None) -> dict:
    """``raw`` (a config.json dict) with ``overrides`` applied: a model of the same architecture
    at another size (fewer layers, a smaller hidden size...). Keys must already be in the config
    (or be one of :data:`OVERRIDE_NEW_KEYS`), so a misspelt key is an error, not a no-op."""
    if not overrides:
        return raw
    unknown = sorted(k for k in overrides if k not in raw and k not in OVERRIDE_NEW_KEYS)
    if unknown:
        raise ValueError(f"config override {unknown[0]!r} is not a key of the "
                         f"{raw.get('model_type', '?')} config")
    return {**raw, **overrides}


#: the embedded default model's name (what the server lists and what ``--model`` accepts for it)
DEFAULT_NAME = "writescope-default"


def config_source(model: str) -> str:
    """Where a command that reads only a model's config (``plan``, ``calibrate``) finds it:
    :data:`DEFAULT_NAME` is the embedded default model's folder (built on first use), unless
    a folder has that name; anything else is a folder or a reference name as given."""
    if model == DEFAULT_NAME and not Path(model).exists():
        from ..models.default import default_model_path
        return str(default_model_path())
    return model


def resolve_model(model: str | os.PathLike | None, random_weights: bool,
                  config_overrides: dict | None = None) -> tuple[ModelConfig, Path | None, str]:
    """(config, checkpoint folder or None, display name). ``model``: a checkpoint folder, a
    reference name (random weights), or None or :data:`DEFAULT_NAME` for the embedded default
    model (a folder of that name wins). ``config_overrides`` (random weights only: a
    checkpoint's tensors have the published shapes) change config.json keys."""
    if config_overrides and not random_weights:
        raise ValueError("config overrides change the model's shapes: they need random_weights=True "
                         "(--random-weights)")
    if model is not None and str(model) == DEFAULT_NAME and not Path(DEFAULT_NAME).exists():
        model = None  # the embedded default model by the name it is served under
    if model is None:
        from ..models.default import default_model_path
        path = default_model_path()
        if config_overrides:
            from ..models.config import load_config_dict
            return (ModelConfig.from_hf(apply_config_overrides(load_config_dict(path),
                                                               config_overrides)),
                    None, DEFAULT_NAME)
        return ModelConfig.from_hf(path), path, DEFAULT_NAME
    s = str(model)
    if s in REFERENCE_MODELS and not Path(s).exists():
        if not random_weights:
            raise ValueError(f"{s!r} names a reference config without weights; pass "
                             "random_weights=True (--random-weights) or a checkpoint folder")
        source: str | Path = s
        name = s
    else:
        source = Path(s).expanduser()
        if not source.exists():
            raise FileNotFoundError(f"model {s!r} is neither a folder nor one of the reference "
                                    f"names {', '.join(REFERENCE_MODELS)} (or {DEFAULT_NAME}, "
                                    "the embedded default model)")
        if not random_weights and not source.is_dir():  # (random weights: a config.json)
            raise NotADirectoryError(f"model {s!r} is a file; pass the checkpoint folder that "
                                     "holds its config.json and weights")
        name = source.name
    if config_overrides:
        from ..models.config import load_config_dict
        cfg = ModelConfig.from_hf(apply_config_overrides(load_config_dict(source), config_overrides))
    else:
        cfg = ModelConfig.from_hf(source)
    return cfg, (None if random_weights or isinstance(source, str) else source), name
