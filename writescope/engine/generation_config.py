"""The model's own sampling defaults, from its ``generation_config.json`` (vLLM's
``generation_config="auto"``, its default).

vLLM reads ``repetition_penalty``, ``temperature``, ``top_k``, ``top_p``, ``min_p`` and
``max_new_tokens`` (as ``max_tokens``) from the checkpoint's generation config and uses them
wherever a request leaves them out: ``LLM.generate`` without sampling parameters,
``LLM.get_default_sampling_params()``, and the OpenAI server's requests
(``ModelConfig.get_diff_sampling_param`` in vLLM). ``"vllm"`` keeps vLLM's (and writescope's)
own defaults; a folder reads that folder's ``generation_config.json`` instead. Qwen3's release
sets temperature 0.6, top-p 0.95, top-k 20; DeepSeek-V2-Lite's temperature 0.3, top-p 0.95.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

#: the fields taken, under SamplingParams' names
FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_tokens")


def sampling_defaults(generation_config: str | os.PathLike | None,
                      model_dir: Path | None) -> dict:
    """The sampling defaults ``generation_config`` asks for: ``"auto"`` (the model folder's
    ``generation_config.json``; none for a reference model with random weights or the default
    model's folder without one), ``"vllm"`` or None (none), or a folder holding a
    ``generation_config.json``. Raises ValueError for a folder without one, or a file that is
    not a JSON object."""
    if generation_config is None or generation_config == "vllm":
        return {}
    if generation_config == "auto":
        if model_dir is None:
            return {}
        path = Path(model_dir) / "generation_config.json"
        if not path.is_file():
            return {}
    else:
        path = Path(generation_config)
        if path.is_dir():
            path = path / "generation_config.json"
        if not path.is_file():
            raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder with a "
                             f"generation_config.json; found none at {path}")
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON: {e}") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path} is not a JSON object")
    if "max_new_tokens" in d:
        d = dict(d, max_tokens=d["max_new_tokens"])
    return {k: d[k] for k in FIELDS if d.get(k) is not None}
