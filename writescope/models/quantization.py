"""Quantized checkpoints: which formats load, and how their weights become the model's.

One format is supported: **block-wise FP8** (``"quant_method": "fp8"``), the format of
DeepSeek-V3/V4's and Qwen's ``-FP8`` releases (e.g. ``Qwen/Qwen3-30B-A3B-FP8``). Each quantized
``...weight`` is a ``float8_e4m3fn`` matrix ``q`` of shape ``[O, I]`` with a sibling
``...weight_scale_inv`` of shape ``[ceil(O/bo), ceil(I/bi)]`` (``weight_block_size`` =
``[bo, bi]``, 128 x 128 in every release); the weight is ``q[o, i] * scale[o // bo, i // bi]``
(the name is historical: the scale multiplies). Which matrices are quantized is read from the
tensors themselves (an ``float8_e4m3fn`` tensor with a scale), not from
``modules_to_not_convert``. Activations are never quantized here: ``activation_scheme:
"dynamic"`` asks a W8A8 kernel to quantize them on the fly, which writescope does not do; it
computes with the dequantized weights, as transformers does with
``FineGrainedFP8Config(dequantize=True)`` -- the parity oracle.

Where the weights go:

* in a bfloat16 run the routed experts stay FP8 where they run, half the bytes they take and a
  decode step reads: in host memory for the CPU's (``layers/cpu_experts.py``, dequantized tile
  by tile inside the kernel), on the compute device for the GPU's (``layers/moe.py``
  ``StackedExperts(fp8=...)``, converted in registers by the fused decode kernels of
  ``layers/moe_triton.py``, an expert at a time for larger steps) -- every path computes with
  the bfloat16 values the load-time path gives (``WRITESCOPE_FP8_DEVICE_EXPERTS=0``
  dequantizes the GPU's at load); experts kept so that hold NaN codes or scales of 2^8 or more,
  which the kernels' integer conversions would not carry, are refused with the tensor's name;
* everything else, and every weight of a float32 run, is dequantized at load
  (:meth:`Fp8Blocks.dequantize`, in float32, then cast to the run's dtype).

Every other ``quantization_config`` (GPTQ, AWQ, bitsandbytes, compressed-tensors, MXFP4, FP8
with static activation scales or per-tensor scales) is refused with a :class:`ConfigError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Fp8Blocks", "quantization_from_hf", "QuantizedCheckpoint", "FP8_MAX"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"


@dataclass(frozen=True)
class Fp8Blocks:
    """Block-wise FP8 (e4m3) weights with one float scale per ``block`` = (rows, columns)."""
    block: tuple[int, int] = (128, 128)

    def __post_init__(self):
        bo, bi = self.block
        if not (isinstance(bo, int) and isinstance(bi, int) and bo > 0 and bi > 0):
            raise ValueError(f"weight_block_size must be two positive ints, got {list(self.block)}")

    @property
    def name(self) -> str:
        return f"fp8 (e4m3, {self.block[0]}x{self.block[1]} blocks)"

    @staticmethod
    def scale_name(weight_name: str) -> str:
        return weight_name + SCALE_SUFFIX

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scale grid of a weight of ``shape`` (``[..., O, I]``)."""
        *lead, o, i = shape
        return (*lead, math.ceil(o / self.block[0]), math.ceil(i / self.block[1]))

    def expand_scale(self, scale: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """``scale`` ([..., ceil(O/bo), ceil(I/bi)]) repeated to one value per weight ([..., O, I]),
        in float32."""
        o, i = shape[-2:]
        s = scale.to(torch.float32)
        return s.repeat_interleave(self.block[0], -2)[..., :o, :].repeat_interleave(
            self.block[1], -1)[..., :i]

    def dequantize(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``q * scale`` per block, in float32 (exact: a 4-bit mantissa times a float32 scale is
        rounded once, as transformers' ``Fp8Dequantize`` computes it)."""
        if q.dtype != FP8_DTYPE:
            raise ValueError(f"expected a float8_e4m3fn tensor, got {q.dtype}")
        want = self.scale_shape(tuple(q.shape))
        if tuple(scale.shape) != want:
            raise ValueError(f"scale of shape {list(scale.shape)} for a weight of shape "
                             f"{list(q.shape)}: expected {list(want)} ({self.name})")
        *lead, o, i = q.shape
        bo, bi = self.block
        if o % bo == 0 and i % bi == 0:  # whole blocks: the scales broadcast, no expanded copy
            blocks = q.to(torch.float32).view(*lead, o // bo, bo, i // bi, bi)
            return (blocks * scale.to(torch.float32)[..., :, None, :, None]).view(q.shape)
        return q.to(torch.float32) * self.expand_scale(scale, tuple(q.shape))

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, scale)`` of ``w`` ([..., O, I]): each block scaled so that its largest magnitude is
        448 (the convention of the FP8 releases), rounded to nearest. For tests and for seeded
        random FP8 weights; an all-zero block gets scale 1."""
        *lead, o, i = w.shape
        bo, bi = self.block
        so, si = math.ceil(o / bo), math.ceil(i / bi)
        pad = torch.zeros(*lead, so * bo, si * bi, dtype=torch.float32, device=w.device)
        pad[..., :o, :i] = w.to(torch.float32)
        blocks = pad.view(*lead, so, bo, si, bi)
        amax = blocks.abs().amax(dim=(-3, -1))
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (blocks / scale[..., :, None, :, None]).to(FP8_DTYPE)
        return q.view(*lead, so * bo, si * bi)[..., :o, :i].contiguous(), scale

    @property
    def bytes_per_weight(self) -> float:
        """Bytes a weight takes stored this way: one, and its block's share of a float32 scale."""
        return 1.0 + 4.0 / (self.block[0] * self.block[1])

    @staticmethod
    def random_scale(std: float) -> float:
        """The one scale of every block of seeded random FP8 weights drawn from N(0, std) (the
        draws are bounded at 3.46 std, which maps to the largest FP8 value)."""
        return 3.47 * std / FP8_MAX

    def to_hf(self) -> dict[str, Any]:
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(self.block)}


def quantization_from_hf(qc: Any) -> Fp8Blocks | None:
    """The scheme of a config.json's ``quantization_config`` (None where there is none), or a
    ``ConfigError`` saying why writescope cannot load it."""
    from .config import ConfigError

    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError(f"quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "")).lower()
    if method != "fp8":
        raise ConfigError(
            f"quantization {method or '(no quant_method)'!r} is not supported; writescope loads "
            "unquantized checkpoints and block-wise FP8 ones (quant_method 'fp8' with "
            "weight_block_size, as in the -FP8 releases)")
    fmt = str(qc.get("fmt", "e4m3") or "e4m3").lower()
    if fmt != "e4m3":
        raise ConfigError(f"fp8 format {fmt!r} is not supported (e4m3 only)")
    act = str(qc.get("activation_scheme", "dynamic") or "dynamic").lower()
    if act != "dynamic":
        raise ConfigError(f"fp8 activation_scheme {act!r} is not supported: writescope computes "
                          "activations unquantized and reads no static input scales (dynamic only)")
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ConfigError("fp8 checkpoints need weight_block_size (two positive ints, e.g. "
                          f"[128, 128]); per-tensor and per-channel scales are not supported, got "
                          f"{block!r}")
    return Fp8Blocks((int(block[0]), int(block[1])))


#: the kept FP8 experts' scales stay below this (``scale * 2^120`` finite in float32)
MAX_KEPT_SCALE = 256.0


def has_nan_codes(q: torch.Tensor) -> bool:
    """Does the float8_e4m3fn tensor ``q`` hold a NaN code (0x7f or 0xff)? Four bytes a word:
    a byte whose low 7 bits are all ones carries into its top bit (~7 GB/s a core)."""
    b = q.reshape(-1).view(torch.uint8)
    head = b.numel() - b.numel() % 4
    if head and b.data_ptr() % 4 == 0:
        t = b[:head].view(torch.int32) & 0x7F7F7F7F
        t += 0x01010101
        t &= -0x7F7F7F80  # 0x80808080
        if bool(t.any()):
            return True
        b = b[head:]
    return bool(((b & 0x7F) == 0x7F).any())


class QuantizedCheckpoint:
    """A :class:`~writescope.models.loader.Checkpoint` seen through an FP8 scheme: scale tensors
    are not model tensors, ``get`` returns every FP8 weight dequantized (float32), ``get_fp8``
    the stored pair. Errors name the tensor and its file."""

    def __init__(self, ckpt, scheme: Fp8Blocks):
        self.ckpt, self.scheme = ckpt, scheme
        self.path = ckpt.path
        raw = ckpt.names()
        self._scaled = {n for n in raw if self.scheme.scale_name(n) in raw}

    def names(self) -> set[str]:
        return {n for n in self.ckpt.names()
                if not (n.endswith(SCALE_SUFFIX) and n[:-len(SCALE_SUFFIX)] in self._scaled)}

    def shape(self, name: str) -> tuple[int, ...]:
        return self.ckpt.shape(name)

    def where(self, name: str) -> str:
        return self.ckpt.where(name)

    def dtype(self, name: str) -> str:
        return self.ckpt.dtype(name)

    def is_fp8(self, name: str) -> bool:
        return name in self._scaled

    def get_fp8(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored ``(q, scale)`` of an FP8 weight kept as bytes (the routed experts),
        checked: also for what the kernels' conversions would not carry -- NaN codes (the CPU
        kernel's and the GPU's integer conversions give finite values for them) and scales that
        are not finite or of 2^8 or more (the conversions scale by ``scale * 2^120``)."""
        from .loader import CheckpointError

        q, s = self._pair(name)
        if has_nan_codes(q):
            raise CheckpointError(f"tensor {name!r} in {self.where(name)} ({self.path}) holds "
                                  f"NaN codes (0x7f / 0xff): a broken FP8 checkpoint")
        if not bool(torch.isfinite(s).all()) or bool((s.abs() >= MAX_KEPT_SCALE).any()):
            sn = self.scheme.scale_name(name)
            raise CheckpointError(f"tensor {sn!r} in {self.where(sn)} ({self.path}) holds "
                                  f"scales that are not finite or of {MAX_KEPT_SCALE:g} or more "
                                  f"(largest {s.abs().max().item():g})")
        return q, s

    def _pair(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored ``(q, scale)`` of an FP8 weight, its dtype and scale shape checked."""
        from .loader import CheckpointError

        q = self.ckpt.get(name)
        s = self.ckpt.get(self.scheme.scale_name(name))
        if q.dtype != FP8_DTYPE:
            raise CheckpointError(f"tensor {name!r} in {self.where(name)} ({self.path}) has a "
                                  f"{SCALE_SUFFIX} but is {q.dtype}, not float8_e4m3fn")
        want = self.scheme.scale_shape(tuple(q.shape))
        if tuple(s.shape) != want:
            sn = self.scheme.scale_name(name)
            raise CheckpointError(f"tensor {sn!r} in {self.where(sn)} ({self.path}) has shape "
                                  f"{list(s.shape)}, expected {list(want)} for "
                                  f"{self.scheme.name}")
        return q, s

    def get(self, name: str) -> torch.Tensor:
        from .loader import CheckpointError

        if name in self._scaled:
            return self.scheme.dequantize(*self._pair(name))
        t = self.ckpt.get(name)
        if t.dtype == FP8_DTYPE:
            raise CheckpointError(f"tensor {name!r} in {self.where(name)} ({self.path}) is "
                                  f"float8_e4m3fn but has no {self.scheme.scale_name(name)!r}")
        return t
