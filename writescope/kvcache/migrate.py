"""``kv_policy="migrate"``: the NEO-style one-state baseline.

A cache with one physical state per host block rebalances CPU and GPU work by *moving data*:
the CPU attends exactly the C blocks and the GPU exactly the T blocks (the default
:meth:`~writescope.kvcache.placement.PlacementPolicy.assign`), so whenever the wanted CPU share
changes, blocks must be copied from one host state to the other and re-laid-out. This is what a
cache without write-time placement has to do: NEO (Jiang et al., "NEO: Saving GPU Memory Crisis
with CPU Offloading for Online LLM Inference", MLSys 2025; github.com/NEO-MLSys25/NEO) balances
GPU and CPU attention by swapping whole sequences' KV between its GPU cache and its CPU cache as
its load-aware scheduler changes its mind; the vLLM/SGLang host tiers do the same with swaps.
Here the granularity is a block, and the bytes moved are counted by the cache in
``kv.bytes_moved_after_placement`` (the other policies keep that counter at 0).

What the policy does each step:

* **target share** -- the CPU share of the batch's spilled KV that the roofline model finds best
  for the current lengths (:func:`writescope.planner.roofline.target_share`, the same function
  the ``writescope`` planner steers its writes with), computed from the hardware profile.
  Without a profile or model config (or without the planner package) the target is the fixed
  ``cpu_share`` given to the constructor: then the policy never needs to move anything and is
  just ``static`` -- a documented fall-back, not a silent one (``stats()['migrate.target_source']``).
* :meth:`migrations` (called by the cache before each step with every sequence of the batch):
  per sequence, the number of C blocks that makes its C fraction of spilled blocks equal the
  target (``floor(target * spilled)``, as :func:`~.placement.fill_then_split` counts it); the
  oldest T blocks move to C, or the newest C blocks move to T, so C stays a prefix of the spill
  as placement writes it. Moves are capped by the destination's free blocks.
* :meth:`place` -- G while it has room, then C up to the target share of the sequence's spilled
  blocks, then T (:func:`~.placement.fill_then_split` with the target).

Constructor (as the engine calls it through ``make_policy("migrate", ...)``)::

    MigratePolicy(profile=HardwareProfile | path | None, model_config=ModelConfig | None,
                  experts_on_cpu=False, cpu_share=0.5, block_size=None, min_move_blocks=1,
                  **ignored)

``profile=None`` with a model config loads this machine's profile the way the ``writescope``
policy does (:func:`writescope.planner.profile.load_or_calibrate`). ``min_move_blocks``: a
sequence is rebalanced only when it is at least this many blocks away from its target (1: track
the target exactly, the most faithful "one state" baseline).
"""
from __future__ import annotations

import math
from typing import Any

from .placement import CacheCapacity, PlacementPolicy, SeqKV, fill_then_split, register_policy
from .regions import DEFAULT_BLOCK_SIZE, Region


def wanted_c_blocks(n_spilled: int, target: float) -> int:
    """C blocks a sequence with ``n_spilled`` spilled blocks should hold at CPU share ``target``
    (the count :func:`~.placement.fill_then_split` places: a floor, all of them at share 1)."""
    if target >= 1.0:
        return n_spilled
    return max(0, min(n_spilled, math.floor(target * n_spilled + 1e-9)))


@register_policy
class MigratePolicy(PlacementPolicy):
    name = "migrate"

    def __init__(self, profile: Any = None, model_config: Any = None, experts_on_cpu: Any = False,
                 cpu_share: float = 0.5, block_size: int | None = None, min_move_blocks: int = 1,
                 **_ignored: Any):
        if not 0.0 <= float(cpu_share) <= 1.0:
            raise ValueError(f"cpu_share must be in [0, 1], got {cpu_share}")
        if int(min_move_blocks) < 1:
            raise ValueError(f"min_move_blocks must be >= 1, got {min_move_blocks}")
        self.fixed_share = float(cpu_share)
        self.cfg = model_config
        # all MoE layers' routed experts on the CPU (True), none, or a flag per layer
        self.experts_on_cpu = (bool(experts_on_cpu) if isinstance(experts_on_cpu, (bool, int))
                               else experts_on_cpu if isinstance(experts_on_cpu, frozenset)
                               else tuple(bool(f) for f in experts_on_cpu))
        self.block_size = int(block_size) if block_size else None
        self.min_move_blocks = int(min_move_blocks)
        self.profile = None
        self.target_source = "fixed"
        if model_config is not None:
            try:
                from ..planner import roofline as _rl  # noqa: F401  (lazy: the planner is optional)
                from ..planner.profile import HardwareProfile, load_or_calibrate
            except ImportError:
                pass
            else:
                if profile is None or isinstance(profile, str):
                    profile = load_or_calibrate(profile, model_config=model_config)
                elif not isinstance(profile, HardwareProfile):
                    profile = HardwareProfile.load(profile)  # a path-like
                self.profile = profile
                self.target_source = "roofline"
        self.target = 0.0 if self.profile is not None else self.fixed_share
        self.predicted_step_s = math.nan
        # the batch as the policy last saw it: seq_id -> SeqKV (with this step's new blocks once placed)
        self._view: dict[int, SeqKV] = {}
        self.blocks_moved = {"T->C": 0, "C->T": 0}
        self.rebalances = 0

    # ------------------------------------------------------------------ target share
    def target_share(self, seqs: list[SeqKV]) -> float:
        """The CPU share of spilled KV wanted for a batch (see the module docstring)."""
        if self.profile is None:
            return self.fixed_share
        from ..planner import roofline as rl
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        resident = spilled = 0.0
        for s in seqs:
            n_g = sum(r is Region.G for r in s.regions)
            resident += n_g * bs + max(0, s.num_tokens - len(s.regions) * bs)
            spilled += (len(s.regions) - n_g) * bs
        plan = rl.target_share(self.profile, self.cfg, max(1, len(seqs)), resident, spilled,
                               self.experts_on_cpu)
        self.predicted_step_s = plan.prediction.step_s
        return float(plan.cpu_share)

    # ------------------------------------------------------------------ the cache's questions
    def migrations(self, seqs: list[SeqKV], capacity: CacheCapacity) -> list[tuple[int, int, Region]]:
        self._learn(capacity)
        self._view = {s.seq_id: s for s in seqs}
        self.target = self.target_share(seqs)
        free = dict(capacity.free)
        moves: list[tuple[int, int, Region]] = []
        for s in seqs:
            spilled = [i for i, r in enumerate(s.regions) if r is not Region.G]
            c_idx = [i for i in spilled if s.regions[i] is Region.C]
            t_idx = [i for i in spilled if s.regions[i] is Region.T]
            delta = wanted_c_blocks(len(spilled), self.target) - len(c_idx)
            if abs(delta) < self.min_move_blocks:
                continue
            if delta > 0:  # the CPU should attend more: the oldest T blocks become C
                pick, dst = t_idx[:min(delta, free.get(Region.C, 0))], Region.C
            else:          # less: the newest C blocks become T
                n = min(-delta, free.get(Region.T, 0))
                pick, dst = (c_idx[len(c_idx) - n:] if n else []), Region.T
            if not pick:
                continue
            free[dst] -= len(pick)
            moves.extend((s.seq_id, i, dst) for i in pick)
            self.blocks_moved["T->C" if dst is Region.C else "C->T"] += len(pick)
            # the view follows the moves, so place() sees the rebalanced sequence
            regions = list(s.regions)
            for i in pick:
                regions[i] = dst
            self._view[s.seq_id] = SeqKV(s.seq_id, s.num_tokens, tuple(regions))
        if moves:
            self.rebalances += 1
        return moves

    def place(self, seq: SeqKV, num_blocks: int, capacity: CacheCapacity) -> list[Region]:
        self._learn(capacity)
        # the sequence as it will be after this step: new blocks G while G has room, rest spilled
        g_new = min(num_blocks, capacity.free.get(Region.G, 0))
        projected = SeqKV(seq.seq_id, seq.num_tokens,
                          tuple(seq.regions) + (Region.G,) * g_new + (Region.T,) * (num_blocks - g_new))
        self._view[seq.seq_id] = projected
        if self.profile is not None and num_blocks > g_new:
            self.target = self.target_share(list(self._view.values()))
        out = fill_then_split(seq, num_blocks, capacity, self.target)
        self._view[seq.seq_id] = SeqKV(seq.seq_id, seq.num_tokens, tuple(seq.regions) + tuple(out))
        return out

    def stats(self) -> dict[str, Any]:
        return {"planner.cpu_share": self.target, "planner.target_share": self.target,
                "planner.predicted_step_s": self.predicted_step_s,
                "migrate.target_source": self.target_source,
                "migrate.blocks_moved_t_to_c": self.blocks_moved["T->C"],
                "migrate.blocks_moved_c_to_t": self.blocks_moved["C->T"],
                "migrate.rebalances": self.rebalances}

    def _learn(self, capacity: CacheCapacity) -> None:
        self.block_size = capacity.block_size
