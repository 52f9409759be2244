"""Routed experts on the CPU, some of a small decode step's read by the GPU over the link.

A decode step with the routed experts on the CPU is bound by the CPU reading the activated
experts' weights: DeepSeek-V2-Lite at batch 1 reads 6 experts x 17.3 MB a layer, ~1.2 ms at the
~88 GB/s its kernel reaches in the engine, most of the step. Meanwhile the PCIe link idles
unless the step streams KV. The weights are page-locked already (the prefill uploader pins them,
``expert_upload.py``), so the GPU can read some of them over the link -- copied into the
uploader's device buffer once the routing is known (:func:`read_mode` ``copy``), or loaded in
place through the unified address space (``mapped``) -- while the CPU reads the others from
DRAM, as hybrid attention serves spilled KV from both paths. Nothing is placed anew: each
reader reads its own experts' bytes once per call.

The split (:func:`split`, on the device, no host synchronisation) gives the link whole experts:
of the ``n_act`` distinct experts the step activates, the ``m`` with the highest ids, ``m`` the
count that minimises ``max((n_act - m) / c, m / l)`` for the link's and the CPU's read rates
``l`` and ``c`` while both read (the profile's ``concurrent_h2d_Bps`` and
``concurrent_cpu_read_Bps``). The CPU kernel gets the routing with those slots set to -1 (it
skips them); two Triton kernels (:func:`run`) compute the link's experts, ``h = silu(x Wg^T) *
(x Wu^T)`` rounded to the weights' dtype as the CPU kernel rounds it, then ``w * (h Wd^T)``,
from the CPU kernel's packed tiles (their device copies, or in host memory). The two results
are added in fp32.
Off CUDA (tests; Triton's interpreter) the same functions run on host tensors, the kernels
through the interpreter or :func:`run_reference`.

When (``WRITESCOPE_EXPERT_LINK``): ``off`` / ``0`` (the default); ``auto`` -- on CUDA, for
decode steps of at most :data:`MAX_TOKENS` tokens that stream no KV (then the link is otherwise
idle through the experts' phase; the runner tells :class:`ExpertLink` per step), at the
profile's share; or a share (0 < s <= 1) that replaces the profile's ratio ``l / (l + c)``,
also off CUDA (tests). The planner and the roofline bound count the link's share only when
it is on.

Status: **opt-in, slower where measured at batch 1** (H200, 2026-12-04h, calls 1-2,
``python -m writescope.bench.expert_link`` and batch-1 ``writescope bench`` rows with
``@expert_link=0`` alternating). The link read the experts at 29-37 GB/s whichever way (mapped:
zero-copy loads; copy: DMA into the uploader's buffer once the launching thread has the
routing), not the 55 GB/s of large pinned copies, and the CPU's part did not get faster by the
bytes it gave away (DeepSeek-V2-Lite at 1 token: 4 experts took the CPU kernel 978-1560 us beside
the link against 1149-1470 for all 6 alone). One layer call at 1 token took 1.2-1.5x as long
with the profile's share (0.36) as the CPU alone; at 4 tokens it was 4-8% shorter (DeepSeek
4466 against 4866 us, Qwen3-30B-A3B 3563 against 3726, copy reads). Engine rows at batch 1 were
1.5-2.2x slower with the link (DeepSeek-V2-Lite 1 x 8K p50 79-100 against 40-66 ms). Left in as
an experiment with its benchmark; not used by default.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: tokens a step may have for the link to take experts (the kernels' token block)
MAX_TOKENS = 16

#: the link's share when no profile says otherwise (the H200's concurrent rates, 54 / (54 + 97))
DEFAULT_SHARE = 0.36


def setting() -> float | str:
    """``WRITESCOPE_EXPERT_LINK``: "auto", 0.0 (off, the default) or a forced share in (0, 1]."""
    raw = os.environ.get("WRITESCOPE_EXPERT_LINK", "off").strip().lower()
    if raw == "auto":
        return "auto"
    if raw in ("off", "no", "false"):
        return 0.0
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0 or math.isnan(v):
        raise ValueError(f"WRITESCOPE_EXPERT_LINK must be 'auto', 'off' or a share in [0, 1], "
                         f"got {raw!r}")
    return v


def profile_share(profile) -> float:
    """The link's share of the experts' bytes at which both readers finish together:
    ``l / (l + c)`` with the rates measured while both read (falling back on the solo ones)."""
    if profile is None:
        return DEFAULT_SHARE
    link = getattr(profile, "concurrent_h2d_Bps", None) or getattr(profile, "h2d_pinned_Bps", 0)
    cpu = getattr(profile, "concurrent_cpu_read_Bps", None) or getattr(profile, "cpu_read_Bps", 0)
    if not link or not cpu or not getattr(profile, "has_gpu", True):
        return 0.0
    return float(link) / (float(link) + float(cpu))


def planned_share(profile, tokens: int) -> float:
    """The share the engine gives the link in a decode step of ``tokens`` tokens that streams
    no KV (the planner's model of :class:`ExpertLink`; the profile stands for a GPU machine)."""
    if not 0 < tokens <= MAX_TOKENS:
        return 0.0
    value = setting()
    return profile_share(profile) if value == "auto" else float(value)


def link_experts_bound(tokens: int, k: int, num_experts: int, share: float) -> int:
    """The most experts :func:`split` can give the link in a step of ``tokens x k`` slots."""
    if share <= 0:
        return 0
    return max(1, min(num_experts, tokens * k, int(math.floor(tokens * k * share)) + 1))


@dataclass
class LinkSplit:
    """One step's split of a layer's routing (all on the routing's device)."""

    ids_cpu: torch.Tensor   # [n, k] int32: the routing with the link's slots set to -1
    experts: torch.Tensor   # [m_max] int32: the link's experts, then num_experts (none)
    weights: torch.Tensor   # [m_max, n] fp32: token t's routing weight for link expert i, or 0


def split(ids: torch.Tensor, w: torch.Tensor, num_experts: int, share: float) -> LinkSplit:
    """Give the link the share of the step's distinct experts that balances the two readers (see
    the module docstring). Fixed shapes, device ops only."""
    n, k = ids.shape
    dev = ids.device
    m_max = link_experts_bound(n, k, num_experts, share)
    flat = ids.reshape(-1).long()
    cnt = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    cnt.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    active = cnt > 0
    n_act = active.sum()
    rank = torch.cumsum(active, 0) - 1
    lo = torch.floor(n_act * share)
    hi = lo + 1

    def cost(m):  # max((n_act - m) / c, m / l), scaled by l c / (l + c)
        return torch.maximum((n_act - m) * share, m * (1.0 - share))

    m = torch.where(cost(hi) < cost(lo), hi, lo)
    m = torch.minimum(m, torch.clamp(n_act.to(m.dtype), max=float(m_max)))
    on_link = active & (rank >= n_act - m.long())
    e_all = torch.arange(num_experts, device=dev)
    experts = torch.sort(torch.where(on_link, e_all, num_experts)).values[:m_max]
    is_link = on_link[flat].view(n, k)
    ids_cpu = torch.where(is_link, torch.full_like(ids, -1), ids).to(torch.int32)
    hit = ids.long()[None, :, :] == experts.long()[:, None, None]   # [m_max, n, k]
    weights = (hit.to(torch.float32) * w.to(torch.float32)[None]).sum(-1)
    return LinkSplit(ids_cpu, experts.to(torch.int32), weights)


# ------------------------------------------------------------------------------- the kernels
@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def gate_up_kernel(X, GU, EXP, HB, n, E,
                       H: tl.constexpr, HP: tl.constexpr, IP: tl.constexpr, MT: tl.constexpr,
                       BK: tl.constexpr, BF16: tl.constexpr, PREC: tl.constexpr):
        i = tl.program_id(0)
        tile = tl.program_id(1)
        e = tl.load(EXP + i).to(tl.int64)
        t = tl.arange(0, MT)
        r = tl.arange(0, 16)
        hrow = HB + (i * MT + t).to(tl.int64)[:, None] * IP + tile * 16 + r[None, :]
        if e < E:
            base = (e * (IP // 16) + tile) * 2 * 16 * HP  # the gate tile; the up tile follows
            acc_g = tl.zeros([MT, 16], dtype=tl.float32)
            acc_u = tl.zeros([MT, 16], dtype=tl.float32)
            for k0 in range(0, HP, BK):
                kk = k0 + tl.arange(0, BK)
                x = tl.load(X + t[:, None] * H + kk[None, :],
                            mask=(t[:, None] < n) & (kk[None, :] < H), other=0.0)
                x = x.to(GU.dtype.element_ty).to(tl.float32)  # (bf16 products are exact in fp32)
                # k [k0, k0 + BK) of the 16-row gate and up tiles as [BK, 16] blocks: bf16 tiles
                # are [Kp/2][16][2] (k pairs per row), fp32 ones [Kp][16]; contiguous runs
                j = k0 * 16 + tl.arange(0, BK * 16)
                g = tl.load(GU + base + j, mask=j < HP * 16, other=0.0)
                u = tl.load(GU + base + 16 * HP + j, mask=j < HP * 16, other=0.0)
                if BF16:
                    g = tl.reshape(tl.permute(tl.reshape(g, [BK // 2, 16, 2]), (0, 2, 1)), [BK, 16])
                    u = tl.reshape(tl.permute(tl.reshape(u, [BK // 2, 16, 2]), (0, 2, 1)), [BK, 16])
                else:
                    g = tl.reshape(g, [BK, 16])
                    u = tl.reshape(u, [BK, 16])
                g = g.to(tl.float32)
                u = u.to(tl.float32)
                acc_g = tl.dot(x, g, acc_g, input_precision=PREC)
                acc_u = tl.dot(x, u, acc_u, input_precision=PREC)
            h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
            if BF16:  # rounded to nearest even by hand, as the CPU kernel rounds (the
                # interpreter's conversion truncates)
                u32 = h.to(tl.uint32, bitcast=True)
                u32 = u32 + 0x7FFF + ((u32 >> 16) & 1)
                tl.store(hrow, (u32 >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True))
            else:
                tl.store(hrow, h)

    @triton.jit
    def down_kernel(HB, DN, EXP, WT, Y, n, E,
                    H: tl.constexpr, HP: tl.constexpr, IP: tl.constexpr, MT: tl.constexpr,
                    BK: tl.constexpr, BF16: tl.constexpr, PREC: tl.constexpr):
        i = tl.program_id(0)
        c = tl.program_id(1)
        e = tl.load(EXP + i).to(tl.int64)
        t = tl.arange(0, MT)
        col = c * 16 + tl.arange(0, 16)
        ymask = (t[:, None] < n) & (col[None, :] < H)
        yrow = Y + (i * n + t).to(tl.int64)[:, None] * H + col[None, :]
        if e < E:
            base = (e * (HP // 16) + c) * 16 * IP
            acc = tl.zeros([MT, 16], dtype=tl.float32)
            for k0 in range(0, IP, BK):
                kk = k0 + tl.arange(0, BK)
                h = tl.load(HB + (i * MT + t).to(tl.int64)[:, None] * IP + kk[None, :],
                            mask=kk[None, :] < IP, other=0.0).to(tl.float32)
                j = k0 * 16 + tl.arange(0, BK * 16)  # as in gate_up_kernel
                d = tl.load(DN + base + j, mask=j < IP * 16, other=0.0)
                if BF16:
                    d = tl.reshape(tl.permute(tl.reshape(d, [BK // 2, 16, 2]), (0, 2, 1)), [BK, 16])
                else:
                    d = tl.reshape(d, [BK, 16])
                d = d.to(tl.float32)
                acc = tl.dot(h, d, acc, input_precision=PREC)
            wt = tl.load(WT + i * n + t, mask=t < n, other=0.0)
            tl.store(yrow, acc * wt[:, None], mask=ymask)
        else:
            tl.store(yrow, tl.zeros([MT, 16], dtype=tl.float32), mask=ymask)

    from ..attention.launch import FastLaunch
    return FastLaunch(gate_up_kernel), FastLaunch(down_kernel)


def _block_k(kp: int) -> int:
    return 64 if kp % 64 == 0 else 32


def kernels_usable(experts, x: torch.Tensor) -> bool:
    """Whether :func:`run` can use the Triton kernels for ``experts`` (the compiled kernel's
    packed tiles) and hidden states ``x`` (on CUDA with the weights page-locked, or under
    Triton's interpreter)."""
    if experts.backend != "cpp" or experts.fp8 is not None:  # (no FP8 tiles in its kernels)
        return False
    if x.is_cuda:
        from ..attention.gpu import triton_available
        return triton_available() and experts.gate_up.is_pinned() and experts.down.is_pinned()
    return os.environ.get("TRITON_INTERPRET") == "1"


def read_mode() -> str:
    """``WRITESCOPE_EXPERT_LINK_READ``: how the GPU reads the link's experts. ``copy``
    (default): the launching thread waits for the layer's routing, then the stream copies the
    link's experts' packed tensors from page-locked memory into the prefill uploader's device
    buffer (DMA, the link's full rate) and the kernels read them there; ``mapped``: the kernels
    read the host tiles in place (zero-copy; on the H200 31-39 GB/s alone and slower beside the
    CPU's reads, which it slowed too: 2026-12-04h call 1)."""
    mode = os.environ.get("WRITESCOPE_EXPERT_LINK_READ", "copy").strip().lower()
    if mode not in ("copy", "mapped"):
        raise ValueError(f"WRITESCOPE_EXPERT_LINK_READ must be 'copy' or 'mapped', got {mode!r}")
    return mode


def run(experts, x: torch.Tensor, sp: LinkSplit, weights: tuple | None = None) -> torch.Tensor:
    """The link's experts' weighted outputs, ``[n, H]`` fp32 on ``x``'s device: the Triton
    kernels reading ``experts``' packed host tiles where they lie (or ``weights``, device copies
    of ``(gate_up, down)`` holding at least the link's experts), or :func:`run_reference`."""
    n = x.shape[0]
    if n == 0:
        return torch.zeros(0, experts.hidden, dtype=torch.float32, device=x.device)
    if n > MAX_TOKENS:
        raise ValueError(f"the link takes experts for at most {MAX_TOKENS} tokens, got {n}")
    gu_t, dn_t = weights if weights is not None else (experts.gate_up, experts.down)
    if weights is None and not kernels_usable(experts, x):
        return run_reference(experts, x, sp)
    m_max = sp.experts.shape[0]
    hp, ip, H = experts.hp, experts.ip, experts.hidden
    dt = experts.dtype
    bf16 = dt == torch.bfloat16
    prec = "ieee"  # fp32 products and sums, as the CPU kernel's
    xs = x.detach().contiguous()
    hb = torch.empty(m_max, MAX_TOKENS, ip, dtype=dt, device=x.device)
    y = torch.empty(m_max, n, H, dtype=torch.float32, device=x.device)
    gate_up, down = _kernels()
    gate_up[(m_max, ip // 16)](xs, gu_t, sp.experts, hb, n, experts.num_experts,
                               H=H, HP=hp, IP=ip, MT=MAX_TOKENS, BK=_block_k(hp), BF16=bf16,
                               PREC=prec, num_warps=4)
    down[(m_max, hp // 16)](hb, dn_t, sp.experts, sp.weights, y, n, experts.num_experts,
                            H=H, HP=hp, IP=ip, MT=MAX_TOKENS, BK=_block_k(ip), BF16=bf16,
                            PREC=prec, num_warps=4)
    return y.sum(0)


def run_reference(experts, x: torch.Tensor, sp: LinkSplit) -> torch.Tensor:
    """:func:`run` in torch, expert by expert from the unpacked host weights (the same rounding:
    ``h`` in the weights' dtype, fp32 products and sums)."""
    out = torch.zeros(x.shape[0], experts.hidden, dtype=torch.float32)
    xf = x.detach().to("cpu", experts.dtype).to(torch.float32)
    wts = sp.weights.to("cpu")
    for i, e in enumerate(sp.experts.tolist()):
        if e >= experts.num_experts:
            continue
        gate, up, dn = (t.to(torch.float32) for t in experts.expert_weights(e))
        h = (F.silu(xf @ gate.T) * (xf @ up.T)).to(experts.dtype).to(torch.float32)
        out += wts[i][:, None] * (h @ dn.T)
    return out.to(x.device)


def submit(experts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, share: float,
           buffer=None):
    """A CPU-expert call with the link taking ``share`` (0: none): the CPU's part queued (its
    inputs copied, its ready word raised), then the link's part enqueued behind it, so both
    read at once. ``buffer``: the prefill uploader (``expert_upload.ExpertUploader``), whose
    device buffer the ``copy`` read mode (:func:`read_mode`) copies the link's experts into;
    without one the kernels read the host tiles in place. Returns what :func:`finish` takes."""
    copy = x.is_cuda and buffer is not None and read_mode() == "copy"
    if share <= 0 or experts.fp8 is not None or (
            x.is_cuda and not copy and not kernels_usable(experts, x)):  # (FP8: the CPU only)
        return experts.submit(x, idx, w), None  # (on CUDA: no buffer, weights not page-locked)
    sp = split(idx, w, experts.num_experts, share)
    handle = experts.submit(x, sp.ids_cpu, w, routed=idx, out_dtype=torch.float32)
    if copy:
        return handle, run(experts, x, sp, weights=copy_experts(experts, sp, buffer))
    return handle, run(experts, x, sp)


def copy_experts(experts, sp: LinkSplit, buffer) -> tuple[torch.Tensor, torch.Tensor]:
    """The link's experts of ``sp`` copied, on the current stream, from their page-locked host
    tensors into ``buffer``'s device views of ``experts``' (same places): the launching thread
    first waits (polling a page-locked word, no CUDA call) for the routing to reach the host --
    the copies' sources depend on it. Returns the device views ``(gate_up, down)``."""
    from ..attention.hostflag import stream_ready
    dev = sp.experts.device
    ids_h = torch.empty(sp.experts.shape, dtype=torch.int32, pin_memory=dev.type == "cuda")
    ids_h.copy_(sp.experts, non_blocking=True)
    stream_ready(dev).synchronize()
    gu, dn = buffer.device_views(experts)
    for e in ids_h.tolist():
        if e < experts.num_experts:
            gu[e].copy_(experts.gate_up[e], non_blocking=True)
            dn[e].copy_(experts.down[e], non_blocking=True)
            buffer.link_bytes += (gu[e].numel() + dn[e].numel()) * gu.element_size()
    return gu, dn


def finish(experts, call, dtype: torch.dtype) -> torch.Tensor:
    """The layer's routed-expert output of a :func:`submit`, in ``dtype`` (the two parts added
    in fp32, rounded once)."""
    handle, linked = call
    out = experts.wait(handle)
    return out if linked is None else (out + linked).to(dtype)


class ExpertLink:
    """Per model: whether, and with which share, the link takes experts in the current step.

    The runner calls :meth:`begin_step` before each step's forward; the MoE layers ask
    :meth:`share_for` with their call's token count. ``buffer``: the prefill uploader whose
    device buffer the link's experts are copied into (:func:`copy_experts`)."""

    def __init__(self, device: torch.device | str, profile=None, share: float | str | None = None,
                 buffer=None):
        self.device = torch.device(device)
        self.buffer = buffer
        value = setting() if share is None else share
        self.forced = value != "auto"
        if self.forced:
            self.share = float(value)
        else:
            self.share = profile_share(profile) if self.device.type == "cuda" else 0.0
        self._step_ok = False
        #: layer calls given a share so far
        self.calls = 0

    @property
    def enabled(self) -> bool:
        return self.share > 0.0

    def begin_step(self, decode: bool, streams: bool) -> None:
        """A step starts: the link may take experts in a decode step that streams no KV."""
        self._step_ok = self.enabled and decode and not streams

    def end_step(self) -> None:
        self._step_ok = False

    def share_for(self, tokens: int) -> float:
        """The share for a layer's call over ``tokens`` tokens in the current step (0: none)."""
        if not self._step_ok or not 0 < tokens <= MAX_TOKENS:
            return 0.0
        self.calls += 1
        return self.share

    def __repr__(self) -> str:
        return f"ExpertLink(share={self.share:.3f}, forced={self.forced})"
