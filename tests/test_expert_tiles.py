"""The CPU expert kernel's weight layout (``layers/expert_tiles.py``): where each weight of an
``[O, K]`` matrix lands in the 16-row VNNI tiles the kernel reads, the zero padding, and the way
back, for the three stored dtypes (bf16 and FP8 bytes in k-pairs, float32 one value a k)."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from writescope.layers.expert_tiles import KPAD, TILE, pack, pack_into, round_up, unpack

DTYPES = (torch.bfloat16, torch.uint8, torch.float32)


def _matrix(o: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(1, 256, (o, k), generator=g, dtype=torch.uint8)  # no zero codes
    return (torch.rand(o, k, generator=g) + 0.5).to(dtype)  # no zeros either


@settings(max_examples=60, deadline=None)
@given(o=st.integers(1, 70), k=st.integers(1, 100), d=st.sampled_from(range(len(DTYPES))),
       seed=st.integers(0, 2**31 - 1))
def test_each_weight_lands_where_the_kernel_reads_it_and_comes_back(o, k, d, seed):
    dtype = DTYPES[d]
    w = _matrix(o, k, dtype, seed)
    op, kp = round_up(o, TILE), round_up(k, KPAD)
    t = pack(w, op, kp)
    assert t.shape == (op // TILE, TILE * kp) and t.dtype == dtype
    # the kernel's addressing: tile r // 16; bf16 and FP8 bytes k-pair by k-pair, the 16 rows
    # of a pair next to each other (2 values each); float32 k by k, 16 rows each
    r = torch.arange(op).view(-1, 1).expand(op, kp)
    c = torch.arange(kp).view(1, -1).expand(op, kp)
    if dtype in (torch.bfloat16, torch.uint8):
        flat = (c // 2) * (2 * TILE) + (r % TILE) * 2 + c % 2
    else:
        flat = c * TILE + r % TILE
    read = t[r // TILE, flat]
    assert torch.equal(read[:o, :k], w)
    # the padding is zeros, and nothing else is
    pad = torch.ones(op, kp, dtype=torch.bool)
    pad[:o, :k] = False
    assert bool((read[pad] == 0).all()) and bool((read[~pad] != 0).all())
    assert torch.equal(unpack(t, o, k, op, kp), w)


@settings(max_examples=30, deadline=None)
@given(o=st.integers(1, 40), k=st.integers(1, 70), d=st.sampled_from(range(len(DTYPES))),
       n=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_pack_into_a_strided_destination_and_unpack_several_experts(o, k, d, n, seed):
    """``pack_into`` writes the same tiles into rows of a larger array (an expert's gate or up
    half of ``gate_up [E, O/16, 2, 16*K]``, strided), and ``unpack`` with leading dims gives
    every expert's matrix back at once."""
    dtype = DTYPES[d]
    op, kp = round_up(o, TILE), round_up(k, KPAD)
    ws = [_matrix(o, k, dtype, seed + e) for e in range(n)]
    gate_up = torch.full((n, op // TILE, 2, TILE * kp), 7, dtype=dtype)
    for e, w in enumerate(ws):
        pack_into(gate_up[e, :, 0], w, op, kp)
        assert torch.equal(gate_up[e, :, 0], pack(w, op, kp))
    assert bool((gate_up[:, :, 1] == 7).all())  # the other half untouched
    back = unpack(gate_up[:, :, 0], o, k, op, kp, (n,))
    assert back.shape == (n, o, k) and torch.equal(back, torch.stack(ws))
