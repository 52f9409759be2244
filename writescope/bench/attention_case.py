"""Random multi-region attention cases with a float64 reference (the tests' and the GPU
attention bench's): pools for all four regions, each sequence's sealed blocks split G / T / C,
its last partial block a W tail, and the step plan over them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.batch import BlockBatch
from ..attention.groups import AttentionStepPlan
from ..attention.reference import dense_attention
from ..kvcache.regions import KVSpec, Region, block_records, pool_shape


@dataclass
class Case:
    spec: KVSpec
    hq: int
    scale: float
    pools: dict
    plan: AttentionStepPlan
    seqs: list  # per sequence: list of (region, block id, valid tokens)
    q_counts: list

    def random_q(self, device, dtype=None, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(sum(self.q_counts), self.hq, self.spec.k_dim, generator=g)
        return q.to(device=device, dtype=dtype or self.spec.dtype)

    def reference(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float64 dense attention of ``q`` over each sequence's whole cached context."""
        spec = self.spec
        outs, lses = [], []
        r0 = 0
        for blocks, nq in zip(self.seqs, self.q_counts):
            qs = q[r0:r0 + nq].cpu().double()
            r0 += nq
            recs = [block_records(reg, self.pools[reg], layer, b)[:n].cpu().double()
                    for reg, b, n in blocks]
            if recs:
                rec = torch.cat(recs)
                o, l = dense_attention(qs, spec.k(rec), spec.v(rec), self.scale)
            else:
                o = torch.zeros(nq, self.hq, spec.v_dim, dtype=torch.float64)
                l = torch.full((nq, self.hq), float("-inf"), dtype=torch.float64)
            outs.append(o)
            lses.append(l)
        return torch.cat(outs), torch.cat(lses)


def _alloc_ids(counts: list[int], n_pool: int, gen: torch.Generator, contiguous: bool
               ) -> list[list[int]]:
    """Block ids for each sequence: contiguous runs (T, as the extent allocator gives) placed in
    a shuffled order with gaps, or scattered ids."""
    if contiguous:
        order = torch.randperm(len(counts), generator=gen).tolist()
        ids: list[list[int]] = [[] for _ in counts]
        nxt = 0
        for i in order:
            nxt += int(torch.randint(0, 2, (1,), generator=gen))
            ids[i] = list(range(nxt, nxt + counts[i]))
            nxt += counts[i]
        return ids
    perm = torch.randperm(n_pool, generator=gen).tolist()
    out, k = [], 0
    for c in counts:
        out.append(perm[k:k + c])
        k += c
    return out


def build_case(spec: KVSpec, hq: int, seq_lens: list[int], q_counts: list[int] | int = 1,
               block_size: int = 16, frac: dict | None = None, w_tail: bool = True,
               cpu_t_frac: float = 0.0, device: str | torch.device = "cpu", seed: int = 0,
               pin: bool | None = None, shared_t: int = 0, shared_c: int = 0) -> Case:
    """Random pools for all four regions and the step plan: each sequence's sealed blocks are
    split G / T / C by ``frac`` (fractions of its sealed blocks), its last partial block is a W
    tail; G/W/T go to the GPU side, C (and a ``cpu_t_frac`` of the T blocks) to the CPU side.
    ``shared_t`` / ``shared_c``: every sequence's first T / C blocks, up to that many, are the
    first sequence's (a prefix that prefix caching found: the same block ids in several block
    tables)."""
    device = torch.device(device)
    if pin is None:
        pin = device.type == "cuda"
    frac = frac or {"G": 0.25, "T": 0.5, "C": 0.25}
    if isinstance(q_counts, int):
        q_counts = [q_counts] * len(seq_lens)
    gen = torch.Generator().manual_seed(seed)
    bs = block_size
    per_seq = []  # per sequence: {region: [valid lens]}
    for n in seq_lens:
        full, rest = divmod(n, bs)
        tail = rest if (w_tail and rest) else 0
        if not w_tail and rest:
            full += 1
        ng = int(round(frac.get("G", 0) * full))
        nt = int(round(frac.get("T", 0) * full))
        nt = min(nt, full - ng)
        nc = full - ng - nt
        lens = {Region.G: [bs] * ng, Region.T: [bs] * nt, Region.C: [bs] * nc,
                Region.W: [tail] if tail else []}
        if not w_tail and rest:  # the last sealed block is partial
            last = next(r for r in (Region.C, Region.T, Region.G) if lens[r])
            lens[last][-1] = rest
        per_seq.append(lens)
    ids = {}
    pools = {}
    for r in Region:
        counts = [len(p[r]) for p in per_seq]
        n_pool = sum(counts) + 2 * len(counts) + 1
        ids[r] = _alloc_ids(counts, n_pool, gen, contiguous=(r is Region.T))
        n_shared = {Region.T: shared_t, Region.C: shared_c}.get(r, 0)
        if n_shared and ids[r]:
            if not w_tail:
                raise ValueError("shared blocks need w_tail (shared blocks are full)")
            for own in ids[r][1:]:
                k = min(n_shared, len(own), len(ids[r][0]))
                own[:k] = ids[r][0][:k]
        on_dev = r in (Region.G, Region.W)
        shape = pool_shape(r, spec, n_pool, bs)
        pool = torch.empty(shape, dtype=spec.dtype, device=device if on_dev else "cpu",
                           pin_memory=bool(pin and r is Region.T))
        src = torch.randn(shape, generator=gen, dtype=torch.float32)
        pool.copy_(src.to(spec.dtype))
        pools[r] = pool
    seqs = []
    side_blocks = {(s, r): ([], []) for s in ("gpu", "cpu") for r in Region}
    for i, p in enumerate(per_seq):
        blocks = []
        for r in Region:
            ids_r, lens_r = ids[r][i], p[r]
            blocks += [(r, b, n) for b, n in zip(ids_r, lens_r)]
            n_cpu_t = int(round(cpu_t_frac * len(ids_r))) if r is Region.T else 0
            for k, (b, n) in enumerate(zip(ids_r, lens_r)):
                side = "cpu" if (r is Region.C or (r is Region.T and k >= len(ids_r) - n_cpu_t)) \
                    else "gpu"
                side_blocks[(side, r)][0].append((i, b))
                side_blocks[(side, r)][1].append(n)
        seqs.append(blocks)
    plan = AttentionStepPlan(spec, spec.k_dim ** -0.5, sum(q_counts))
    for (side, r), (bl, ln) in side_blocks.items():
        if not bl:
            continue
        per_b = [[b for s, b in bl if s == i] for i in range(len(seq_lens))]
        per_l = [[n for (s, _), n in zip(bl, ln) if s == i] for i in range(len(seq_lens))]
        batch = BlockBatch.build(q_counts, per_b, per_l,
                                 device=device if side == "gpu" else "cpu")
        getattr(plan, side).append((r, batch))
    return Case(spec, hq, plan.scale, pools, plan, seqs, q_counts)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.double().cpu()
    b = b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
