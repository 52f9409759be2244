"""Linear layers that read the same input, their weights laid out as rows of one tensor.

A decode step's GEMMs are GEMVs over a few rows: each reads its weight once and costs a launch.
Where several projections take the same input (GQA's q, k and v; a gated MLP's gate and up),
the loader gives their weights consecutive rows of one tensor before filling them, so one GEMM
over that tensor computes all of them on CUDA (one pass over the rows, fewer launches). The
modules keep their own ``weight`` parameters (views of the shared tensor): names, loading and
the CPU's per-projection GEMMs stay as they were.
"""
from __future__ import annotations

import torch
from torch import nn


def share_rows(linears) -> torch.Tensor | None:
    """Give ``linears`` (``nn.Linear`` without biases, of one input size) weights that are
    consecutive rows of one new tensor, in order, and return it; None (nothing changed) where a
    layer has a bias or is still on the meta device. Call before the weights are filled."""
    lins = tuple(linears)
    w = lins[0].weight
    if any(l.bias is not None or l.weight.is_meta for l in lins):
        return None
    if any(l.weight.shape[1] != w.shape[1] for l in lins):
        raise ValueError("stacked projections need one input size")
    buf = torch.empty(sum(l.weight.shape[0] for l in lins), w.shape[1], dtype=w.dtype,
                      device=w.device)
    row = 0
    for l in lins:
        rows = l.weight.shape[0]
        l.weight = nn.Parameter(buf[row:row + rows], requires_grad=False)
        row += rows
    return buf


def still_rows(buf: torch.Tensor | None, linears) -> bool:
    """Whether each of ``linears``' weights still is its rows of ``buf`` (nothing moved or
    replaced it since :func:`share_rows`)."""
    if buf is None:
        return False
    step = buf.stride(0) * buf.element_size()
    at = buf.data_ptr()
    for l in linears:
        if l.weight.data_ptr() != at or l.weight.dtype != buf.dtype:
            return False
        at += l.weight.shape[0] * step
    return True
