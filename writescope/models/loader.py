"""Build a model from a Hugging Face checkpoint (safetensors, memory-mapped) or at full size with
seeded random weights.

Parameters are named like the hub's tensors, so loading is a name lookup; the routed experts are
the one exception: the hub stores one tensor per expert and projection
(``...experts.7.gate_proj.weight``), which the loader stacks into the layer's expert tensors (on
the compute device) or hands to :class:`~writescope.layers.cpu_experts.CpuExperts` (host memory)
when that layer's experts run on the CPU. Block-wise FP8 checkpoints (``models/quantization.py``)
are read through :class:`~writescope.models.quantization.QuantizedCheckpoint`: dequantized at load,
except CPU experts of a bfloat16 run, which stay FP8 in host memory.
"""
from __future__ import annotations

import json
import math
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from ..layers.moe import StackedExperts
from .base import CausalLM
from .config import ModelConfig
from .quantization import QuantizedCheckpoint
from .registry import model_class


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not match the model: missing, unexpected or wrong shape."""


# --------------------------------------------------------------------------- checkpoint files
class _BinFile:
    """A PyTorch ``.bin`` state dict, as safetensors' handle is read (loaded once, memory-mapped
    where the file allows)."""

    def __init__(self, path: Path):
        try:
            sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (not zip) format cannot be memory-mapped
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
        if not isinstance(sd, dict):
            raise CheckpointError(f"{path.name} does not hold a state dict")
        self._sd = sd

    def keys(self):
        return self._sd.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._sd[name]

    def get_slice(self, name: str):
        t = self._sd[name]
        return type("_Slice", (), {"get_shape": lambda _s: list(t.shape)})()


class Checkpoint:
    """The tensors of a checkpoint folder, opened lazily: safetensors (an index's shards,
    ``model.safetensors``, or whatever ``*.safetensors`` files it holds), else PyTorch ``.bin``
    files the same ways -- the order vLLM's default loader tries them in."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = Path(path)
        self._open: dict[Path, object] = {}
        self._keys: dict[Path, set[str]] = {}  # each open file's tensor names
        self._safe_open = safe_open
        self.file_of = None
        for ext in ("safetensors", "bin"):
            stem = "model" if ext == "safetensors" else "pytorch_model"
            index = self.path / f"{stem}.{ext}.index.json"
            if index.exists():
                self.file_of = {name: self.path / f
                                for name, f in self._weight_map(index).items()}
                break
            files = sorted(self.path.glob(f"*.{ext}"))
            if files:
                self.file_of = {n: f for f in files for n in self._handle(f).keys()}
                break
        if self.file_of is None:
            raise CheckpointError(f"no weights in {self.path}: no model.safetensors(.index.json), "
                                  "*.safetensors, pytorch_model.bin(.index.json) or *.bin")

    @staticmethod
    def _weight_map(index: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise CheckpointError(f"{index} is not a JSON object: {e}") from e
        if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index} has no \"weight_map\" of tensor names to file names")
        return weight_map

    def _handle(self, f: Path):
        h = self._open.get(f)
        if h is None:
            if not f.exists():
                raise CheckpointError(f"shard {f.name} listed in the index is missing from {self.path}")
            try:  # a truncated, empty or foreign file: its name, not the reader's bare error
                h = _BinFile(f) if f.suffix == ".bin" else \
                    self._safe_open(str(f), framework="pt", device="cpu")
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - safetensors' errors are no common type
                raise CheckpointError(f"cannot read {f.name} in {self.path} (truncated or not a "
                                      f"{f.suffix[1:]} file?): {e}") from e
            self._open[f], self._keys[f] = h, set(h.keys())
        return h

    def _tensor_handle(self, name: str):
        f = self.file_of[name]
        h = self._handle(f)
        if name not in self._keys[f]:
            raise CheckpointError(f"the index of {self.path} puts tensor {name!r} in "
                                  f"{self.file_of[name].name}, which does not hold it")
        return h

    def names(self) -> set[str]:
        return set(self.file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensor_handle(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The tensor's dtype as safetensors names it (``"F32"``, ``"BF16"``, ``"I32"``...;
        a ``.bin`` file's as torch does)."""
        h = self._tensor_handle(name)
        return str(h.get_tensor(name).dtype) if isinstance(h, _BinFile) else \
            h.get_slice(name).get_dtype()

    def get(self, name: str) -> torch.Tensor:
        return self._tensor_handle(name).get_tensor(name)

    def where(self, name: str) -> str:
        f = self.file_of.get(name)
        return f.name if f is not None else "model.safetensors.index.json"


# --------------------------------------------------------------------------- model building
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _is_fp32_param(cfg: ModelConfig, name: str) -> bool:
    # DeepSeek keeps its router in float32 (transformers: _keep_in_fp32_modules_strict)
    return cfg.model_type == "deepseek_v2" and name.endswith("gate.weight") and ".experts." not in name


def _materialize(model: nn.Module, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Replace meta parameters by empty ones of the right dtype on ``device``."""
    for mod_name, mod in model.named_modules():
        for pname, p in list(mod._parameters.items()):
            if p is None or not p.is_meta:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            dt = torch.float32 if _is_fp32_param(cfg, full) else dtype
            if not p.dtype.is_floating_point or full.endswith("_scale"):
                dt = p.dtype  # FP8 experts' bytes and their float32 scales (layers/moe.py)
            mod._parameters[pname] = nn.Parameter(torch.empty(p.shape, dtype=dt, device=device),
                                                  requires_grad=False)


def expert_tensor_names(model: CausalLM, layer: int, expert: int) -> tuple[str, str, str]:
    prefix = f"model.layers.{layer}.{model.mlp_name}.experts.{expert}"
    return tuple(f"{prefix}.{n}.weight" for n in model.expert_names)  # gate, up, down


def build_model(cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device | str,
                checkpoint: str | Path | None = None, random_weights: bool = False, seed: int = 0,
                cpu_expert_layers: list[bool] | None = None,
                progress=None) -> CausalLM:
    """Build ``cfg``'s model on ``device`` and fill its weights (checkpoint or seeded random).

    ``progress``: called with the number of tensor groups once it is known, returns a
    tqdm-like bar that advances per group."""
    device = torch.device(device)
    if checkpoint is None and not random_weights:
        raise ValueError("build_model needs a checkpoint folder or random_weights=True")
    cls = model_class(cfg)
    with torch.device("meta"):
        model = cls(cfg)
    cpu_layers = cpu_expert_layers or [False] * cfg.num_layers
    ckpt = None
    if checkpoint is not None:
        ckpt = Checkpoint(Path(checkpoint))
        if cfg.quantization is not None:
            ckpt = QuantizedCheckpoint(ckpt, cfg.quantization)
    for i, moe in model.moe_blocks():
        if cpu_layers[i]:
            moe.experts = None  # filled below with host-memory experts
        elif _fp8_device_experts(cfg, ckpt, model, i, dtype, device):
            with torch.device("meta"):
                moe.experts = StackedExperts(cfg.num_experts, cfg.hidden_size,
                                             cfg.moe_intermediate_size, fp8=cfg.quantization)
    _materialize(model, cfg, dtype, device)
    for m in model.modules():  # before the weights are filled (models/gqa.py)
        if hasattr(m, "share_projection_storage"):
            m.share_projection_storage()
    model.rotary = type(model.rotary)(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    model.eval()
    bar = None if progress is None else progress(
        sum(1 for _ in _dense_params(model)) + len(model.moe_blocks()))
    tick = bar.update if bar is not None else None
    if ckpt is not None:
        _load_checkpoint(model, cfg, ckpt, dtype, cpu_layers, tick)
    else:
        _init_random(model, cfg, dtype, seed, cpu_layers, tick)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def _dense_params(model: CausalLM) -> Iterator[tuple[str, nn.Parameter]]:
    for name, p in model.named_parameters():
        if ".experts.gate_up" in name or ".experts.down" in name:
            continue
        if model.cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        yield name, p


def _load_checkpoint(model: CausalLM, cfg: ModelConfig, ckpt: Checkpoint, dtype: torch.dtype,
                     cpu_layers: list[bool], progress) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    dense = dict(_dense_params(model))
    for name, p in dense.items():
        expected[name] = tuple(p.shape)
    h, inter = cfg.hidden_size, cfg.moe_intermediate_size
    for i, _ in model.moe_blocks():
        for e in range(cfg.num_experts):
            g, u, d = expert_tensor_names(model, i, e)
            expected[g] = expected[u] = (inter, h)
            expected[d] = (h, inter)
    present = {n for n in ckpt.names() if not n.endswith(IGNORED_SUFFIXES)}
    if cfg.tie_word_embeddings:
        present.discard("lm_head.weight")
    missing = sorted(set(expected) - present)
    if missing:
        raise CheckpointError(f"checkpoint {ckpt.path} is missing tensor {missing[0]!r}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    # zero-size tensors hold no weights (transformers saves a DeepSeek-V2 with no shared
    # experts with empty shared_experts projections)
    unexpected = sorted(n for n in present - set(expected) if math.prod(ckpt.shape(n)) > 0)
    if unexpected:
        n = unexpected[0]
        raise CheckpointError(f"unexpected tensor {n!r} in {ckpt.where(n)} ({ckpt.path}) "
                              f"for model_type {cfg.model_type}")
    for n, shape in expected.items():
        got = ckpt.shape(n)
        if got != shape:
            raise CheckpointError(f"tensor {n!r} in {ckpt.where(n)} ({ckpt.path}) has shape "
                                  f"{list(got)}, expected {list(shape)}")
        dt = ckpt.dtype(n)  # an integer or boolean tensor would be cast into nonsense weights
        if not dt.startswith(("F", "BF", "torch.float", "torch.bfloat")):
            raise CheckpointError(f"tensor {n!r} in {ckpt.where(n)} ({ckpt.path}) has dtype "
                                  f"{dt}, expected floating-point weights")
    with torch.no_grad():
        for name, p in dense.items():
            p.copy_(ckpt.get(name).to(p.dtype))
            if progress:
                progress(1)
        for i, moe in model.moe_blocks():
            names = [expert_tensor_names(model, i, e) for e in range(cfg.num_experts)]
            if cpu_layers[i]:
                from ..layers.cpu_experts import CpuExperts
                if _fp8_cpu_experts(cfg, ckpt, names, dtype):
                    pairs = [[ckpt.get_fp8(n[j]) for n in names] for j in range(3)]
                    moe.use_cpu_experts(CpuExperts.from_fp8(*pairs, fp8=cfg.quantization))
                else:
                    stack = [torch.stack([ckpt.get(n[j]) for n in names]) for j in range(3)]
                    moe.use_cpu_experts(CpuExperts.from_weights(*stack, dtype=dtype))
            elif moe.experts.fp8 is not None:
                for e, (g, u, d) in enumerate(names):
                    moe.experts.set_expert_fp8(e, ckpt.get_fp8(g), ckpt.get_fp8(u),
                                               ckpt.get_fp8(d))
            else:
                for e, (g, u, d) in enumerate(names):
                    moe.experts.gate_up[e, :inter].copy_(ckpt.get(g).to(dtype))
                    moe.experts.gate_up[e, inter:].copy_(ckpt.get(u).to(dtype))
                    moe.experts.down[e].copy_(ckpt.get(d).to(dtype))
            if progress:
                progress(1)


def _fp8_cpu_experts(cfg: ModelConfig, ckpt, names: list[tuple[str, str, str]],
                     dtype: torch.dtype) -> bool:
    """Whether a layer's CPU experts stay FP8 in host memory (``models/quantization.py``): every
    one of its expert matrices is FP8 in the checkpoint and the kernel can compute with them
    (a bfloat16 run with the compiled kernel; else they are dequantized here, with a warning
    where the run is bfloat16)."""
    if not isinstance(ckpt, QuantizedCheckpoint) or not all(
            ckpt.is_fp8(n) for triple in names for n in triple):
        return False
    from ..layers.cpu_experts import CpuExperts
    why = CpuExperts.fp8_unsupported(cfg.quantization, dtype)
    if why is not None and dtype == torch.bfloat16:
        _warn_once(f"writescope: the CPU experts are dequantized to bfloat16 at load, twice the "
                   f"host bytes and reads of FP8 ({why})")
    return why is None


def _fp8_device_experts(cfg: ModelConfig, ckpt, model: CausalLM, layer: int,
                        dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a layer's experts on the compute device stay FP8 there (``layers/moe.py``): an FP8
    config in a bfloat16 run on CUDA (``StackedExperts.fp8_unsupported``), and, from a
    checkpoint, every one of the layer's expert matrices FP8 in it (else they are dequantized at
    load)."""
    if cfg.quantization is None or StackedExperts.fp8_unsupported(cfg.quantization, dtype,
                                                                  device):
        return False
    if ckpt is None:  # random weights
        return True
    names = [expert_tensor_names(model, layer, e) for e in range(cfg.num_experts)]
    return isinstance(ckpt, QuantizedCheckpoint) and all(
        ckpt.is_fp8(n) for triple in names for n in triple)


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _seed_for(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _init_random(model: CausalLM, cfg: ModelConfig, dtype: torch.dtype, seed: int,
                 cpu_layers: list[bool], progress) -> None:
    """Seeded init like the models' own ``_init_weights``: normal(0, initializer_range) for
    matrices and embeddings, ones for norms. Each tensor has its own seed (stable across runs)."""
    std = float(cfg.raw.get("initializer_range", 0.02))
    with torch.no_grad():
        for name, p in _dense_params(model):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                g = torch.Generator(device=p.device).manual_seed(_seed_for(seed, name))
                p.normal_(0.0, std, generator=g)
            if progress:
                progress(1)
        for i, moe in model.moe_blocks():
            if cpu_layers[i]:
                from ..layers.cpu_experts import CpuExperts
                fp8 = cfg.quantization
                if fp8 is not None and CpuExperts.fp8_unsupported(fp8, dtype) is not None:
                    fp8 = None
                moe.use_cpu_experts(CpuExperts.random(cfg.num_experts, cfg.hidden_size,
                                                      cfg.moe_intermediate_size, dtype=dtype,
                                                      seed=_seed_for(seed, f"experts.{i}"), std=std,
                                                      fp8=fp8))
            elif moe.experts.fp8 is not None:
                _random_fp8_experts(moe.experts, _seed_for(seed, f"experts.{i}"), std)
            else:
                for t in (moe.experts.gate_up, moe.experts.down):
                    g = torch.Generator(device=t.device).manual_seed(_seed_for(seed, f"{i}.{t.shape}"))
                    t.normal_(0.0, std, generator=g)
            if progress:
                progress(1)


def _random_fp8_experts(experts: StackedExperts, seed: int, std: float) -> None:
    """Seeded random FP8 experts on their device, with the scale and bounds of
    ``CpuExperts.random``'s (other values: another generator): every block scaled by
    ``Fp8Blocks.random_scale(std)``, the values N(0, std) bounded at 3.46 std, rounded to FP8;
    drawn an expert at a time (one float32 matrix at a time on the device)."""
    scale = experts.fp8.random_scale(std)
    experts.gate_up_scale.fill_(scale)
    experts.down_scale.fill_(scale)
    g = torch.Generator(device=experts.gate_up.device).manual_seed(seed)
    for e in range(experts.gate_up.shape[0]):
        for t in (experts.gate_up[e], experts.down[e]):
            w = torch.empty(t.shape, dtype=torch.float32, device=t.device).normal_(
                0.0, std, generator=g).clamp_(-3.46 * std, 3.46 * std)
            t.copy_((w / scale).to(torch.float8_e4m3fn).view(torch.uint8))
