"""``kv_policy="writescope"``: write-time placement and per-step assignment from the roofline.

The cache asks (see :mod:`writescope.kvcache.placement`):

* ``place(seq, k, capacity)`` -- where the ``k`` blocks this sequence seals now go. G while it has
  free blocks (the GPU reads G in place at HBM speed: nothing beats it). Each spilled block then
  goes to C or T, whichever brings the batch's C fraction of its spilled blocks closer to the
  **target share** (ties to T, the flexible region; the batch's, so that blocks placed earlier
  against another target are made up for), taken for the batch as it will be once
  these blocks are sealed (a prefill chunk's spill included) and every admitted prompt is in
  (``admit(seq_id, prompt_tokens)``, from the cache when the scheduler admits a request: a
  chunked prefill then aims every chunk at one target), and so is every waiting prompt the
  scheduler would admit next (``expect(queued)``, before each step: two 128K prompts under a
  16K token budget are admitted one after the other, and the first, placed for a batch of one,
  put 0.86 of its spill in C against 0.56 for the batch of two; 2026-12-01e call 2). Blocks are never moved afterwards: as the
  target rises with context length, the split is steered by where *new* blocks land. Because
  they stay, the target gives the CPU a share only for a predicted gain of
  ``roofline.PLACEMENT_MIN_GAIN`` (3%) of the step, and takes the GPU side no slower than its
  profile (its measured factor counts launch gaps; see :meth:`_placement_corrections`).
  Until the CPU path has been *measured* (``verify_steps`` decode steps in which the CPU
  attended blocks and was timed, so the feedback has corrected its rate), the target is taken
  with a CPU ``UNVERIFIED_CPU_FACTOR`` (2) times slower than its profile: C blocks are committed
  to the CPU's layout for good, so before the CPU is measured only the share that would pay
  even at half its rate goes there; the rest goes to T, which either side can read (on the H200
  machine the CPU side once ran at 13 GB/s inside the engine against 63 GB/s calibrated alone,
  and C blocks placed from the uncorrected model during a 32K prefill kept the CPU busy for
  good: bench/results/2026-11-30-h200/; a bench row prefilled with T only, after a warm-up
  that had not verified the planner, ran 8% behind ``static``: 2026-12-01-h200). Meanwhile a
  step whose plan gives the CPU nothing reads T blocks in place at the long-context share
  (:func:`~.roofline.bandwidth_ratio`) all the same, so that a first batch the model keeps off
  the CPU (one sequence) still gets the path measured (``planner.probes``).
* ``assign(seq)`` -- who attends each sealed block this step. C blocks are the CPU's (their
  layout is the CPU kernel's). T blocks go to the GPU (streamed), except that when the step plan
  says the CPU should take more than the C blocks, it reads some T blocks in place (the oldest
  ones, so the streamed blocks stay one contiguous run at the end). With the routed experts on
  the CPU the step plan asks the placement's 3% gain for that (:attr:`step_min_gain`).
* ``observe(timing)`` -- closes the step: corrects the rates (:mod:`.feedback`) and plans anew.
  The first step in which the CPU attended does not correct its rate if it took more than 3x
  the model's time (it may pay the thread team's start-up). When the corrected rates give the CPU no T blocks, every ``PROBE_EVERY`` (16)
  decode steps one step is planned at the uncorrected model's share, so a CPU factor made
  pessimistic by a slow moment is measured again rather than kept for good
  (``planner.probes``). A step whose lengths and rate factors are within 1% of the last solve
  (``MEMO_TOLERANCE``), in the same form (pipelined or not), reuses its shares, and so does a
  placement's target: the optimiser is most of the planner's host time, and a decode step at
  8K is host-bound.
  Only decode steps (every sequence one token longer, seen by comparing ``batch_lengths`` with
  the lengths ``assign`` was shown) correct the rates; ``planner.predicted_step_s`` (made
  before the step ran, from the state after the previous one) and ``planner.measured_step_s``
  are those of the last decode step. Step time the per-path model does not explain (Python,
  launches, sampling) is learnt as an additive ``planner.step_overhead_s``; a step more than
  ``OVERHEAD_OUTLIER_RATIO`` (3) times its prediction is left out of it unless the next one is
  too, and so is a step size's first, eager run (``new_shape`` in its timing). A decode step
  closed before its device work ran (overlapped, ``untimed``) learns nothing; its prediction is
  the model's alone (its host time hides behind the device's), made when :meth:`stats` asks
  for it.

Two shares come out of the roofline (:mod:`.roofline`), both over the batch of the last step:

* the *target share*: the best CPU share of spilled KV if every block sat where it should
  (:func:`~.roofline.target_share`) -- it steers placement;
* the *step share* (``planner.cpu_share``): the best share given where the blocks actually are
  (:func:`~.roofline.optimal_cpu_share`: at least the C blocks, at most C + T) -- it drives
  ``assign``.

Blocks several sequences hold (prefix caching: one document, many questions): before a step's
``assign`` calls the cache tells the policy how many distinct T and C blocks two or more of its
sequences hold (``note_shared``), and each ``SeqKV`` how many of its own are among them
(``shared_t``, ``shared_c``). The staging ring moves a shared T block once a step, and its other
listings are HBM reads. Two models, by whether the CPU kernel reads a block several sequences
list once for all of them (:func:`~writescope.attention.shared_reads.active`: GQA by default;
not MLA, whose kernel is bound by its products, which are per listing):

* it does: a shared block counts once on either side. The distinct shared T tokens join the T
  tokens either side may read, the CPU's T share takes them first, oldest first, for every
  holder (:meth:`WriteScopePolicy.shared_t_to_cpu`), then a fraction of each sequence's private
  ones; a shared C block counts once among the C tokens, and placement counts both once;
* it does not: the cache keeps shared T blocks off the CPU, so the model streams them once
  whatever the share (``fixed_t`` of :func:`~.roofline.optimal_cpu_share`), the share is of C +
  private T + the distinct shared T, ``assign`` hands the CPU a fraction of each sequence's
  private T blocks, and placement counts a shared T block once.

(Counted once per sequence, 8 prompts sharing a 32K prefix on DeepSeek-V2-Lite were planned at
29.7 ms a step and ran at 18.7: 2026-12-06 call 1 of the sixty-eighth session. Qwen3-30B-A3B's 8
prompts sharing 32K, with the CPU reading 100 shared T blocks in place: 47.1 ms against
transfer's 56.6, 57.2 without: 2026-12-06i call 2.)

Constructor (as the cache calls it through ``make_policy("writescope", ...)``)::

    WriteScopePolicy(profile=HardwareProfile | path | None, model_config=ModelConfig,
                     experts_on_cpu=False, batch_hint=None, feedback_alpha=0.3,
                     block_size=None, verify_steps=2, **ignored)

``profile=None`` loads this machine's profile or runs a quick calibration and caches it
(:func:`~.profile.load_or_calibrate`). ``batch_hint``: the expected number of sequences per step;
only used before the first step shows the real batch. ``block_size``: tokens per block (learnt
from the first ``place`` call when not given; 64 until then). Unknown options (``cpu_share``, ...) are
accepted and ignored so every policy takes the same call.

Timing keys read by :meth:`observe` (per step, summed over layers): ``cpu_s`` (CPU attention, with
its round trips), ``gpu_s`` (GPU attention), ``pcie_s`` (H2D of T blocks; 0 or missing = not
measured), ``step_s`` (wall), ``cpu_bytes``/``gpu_bytes`` (KV bytes each side attended, all
layers), ``t_bytes`` (T bytes streamed; missing: taken from this policy's own assignment),
``cpu_t_bytes`` (of ``cpu_bytes``, the T blocks read in place; missing: the split this policy
assigned), ``batch_lengths``; optionally ``cpu_expert_s`` (routed experts on the CPU).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any

from ..attention import shared_reads
from ..kvcache.placement import CacheCapacity, PlacementPolicy, SeqKV, register_policy
from ..kvcache.regions import DEFAULT_BLOCK_SIZE, Region
from . import roofline as rl
from .feedback import RateFeedback
from .profile import HardwareProfile, load_or_calibrate


#: decode steps without CPU attention after which a step is planned at the uncorrected share
PROBE_EVERY = 16
#: until the CPU path is measured in the engine, placement plans with a CPU this many times
#: slower than its profile (its rate and its round trips): C gets only the share that would pay
#: even then, and the CPU reads T blocks in place for the rest (2026-12-01: 59 GB/s in the
#: engine against 82 alone on the H200; 13 against 63 on 2026-11-30, before the native kernels)
UNVERIFIED_CPU_FACTOR = 2.0
#: placement takes the CPU's measured per-byte rate this many times slower. The two errors cost
#: differently: T blocks the step plan wants on the CPU it reads in place (at the T rate, a few
#: per cent dearer), while C blocks past the best share keep the CPU the step's bottleneck for
#: good. And the factor placement knows is the one learnt before the batch's long-context steps:
#: on the H200, the bench's warm-up left factors ~1.0 that put Qwen3 / Mixtral 2 x 128K (experts
#: on the GPU) at 0.61 / 0.64 of the spill in C, and their decode steps then measured 1.49 / 1.31,
#: whose best shares are 0.51 / 0.57 (2026-12-01e call 3: writescope 0.90x static on Mixtral).
#: A/B on DeepSeek-V2-Lite 4 x 128K (two rounds each, 2026-12-03c call 2 and 2026-12-03g call 1):
#: neither 1.2 nor 1.0 beat 1.4 in both rounds; 1.4 beat static in both rounds of the latter
PLACEMENT_CPU_MARGIN = 1.4


def _env_number(name: str, default: float, allow_zero: bool = False) -> float:
    """The environment's number ``name`` (> 0, or >= 0 with ``allow_zero``), else ``default``;
    a ValueError naming the setting for anything else."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a number {'>=' if allow_zero else '>'} 0, not {text!r}")
    return value


def placement_cpu_margin() -> float:
    """``WRITESCOPE_PLACEMENT_CPU_MARGIN`` when set (a number > 0; 1 plans C with the CPU's
    measured rate), else :data:`PLACEMENT_CPU_MARGIN`."""
    return _env_number("WRITESCOPE_PLACEMENT_CPU_MARGIN", PLACEMENT_CPU_MARGIN)


#: a sequence's CPU-read T blocks stay the last step's while the new count is within this
#: fraction of its private T blocks (0: off, the default). See :func:`share_hold`.
SHARE_HOLD = 0.0


def share_hold() -> float:
    """``WRITESCOPE_SHARE_HOLD`` when set (a fraction >= 0), else :data:`SHARE_HOLD`: a
    sequence keeps the last step's count of oldest T blocks read by the CPU in place while the
    plan's new count differs from it by at most this fraction of its private T blocks (at
    least one block when > 0). The planner's rate corrections move the share a little every
    step; each move changes the streamed T batch, and with it the staging ring's plan, which
    drops the units staged ahead for the step (``WRITESCOPE_STAGING_AHEAD``). Holding costs at
    most this fraction of the spilled KV on the slower side."""
    return _env_number("WRITESCOPE_SHARE_HOLD", SHARE_HOLD, allow_zero=True)


#: the first CPU-timed step is not used when it took more than this times the model's time
FIRST_CPU_SAMPLE_MAX_RATIO = 3.0

#: a decode step whose launching thread was busy this share of it or more (``host_s`` over
#: ``step_s``; on a machine with a GPU) is host-bound: its GPU attention time does not correct
#: the GPU's rate. The events around the GPU kernels then bracket the launching thread's gaps,
#: and a GPU factor that took them in (1.65-1.94 in DeepSeek-V2-Lite 4 x 32K rows, host-bound
#: fraction 0.93, 2026-12-03d call 1) made CPU attention look free under a slow GPU: the plan
#: moved 3% of the KV to the CPU, whose calls added host work to that very step (0.80x
#: transfer's step). With this guard the same row's GPU factor stayed at 1.06 and writescope ran
#: 0.96x transfer (2026-12-03e call 3).
HOST_BOUND_FRACTION = 0.7
#: a decode step that took more than this times the planner's prediction (one that compiled a
#: kernel, a stall) does not move the learnt overhead, unless the next one does too. Beside the
#: ``new_shape`` steps kept out of it: slow steps before a row left the overhead at 78 ms for
#: a whole 4 x 32K row of 5 ms steps on the H200 (predictions 20x the steps, 2026-12-04b call 2)
OVERHEAD_OUTLIER_RATIO = 3.0

#: a step's plan reuses the last solve while the batch size is the same and every token count
#: and rate factor is within this relative distance of the one it was solved for
MEMO_TOLERANCE = 0.01


def _close(a: tuple, b: tuple) -> bool:
    """Two planning states ``(batch, resident, c_tokens, t_tokens, corrections, form)`` within
    :data:`MEMO_TOLERANCE` of each other (the batch and the step's form, pipelined or not,
    the same)."""
    if a[0] != b[0] or a[5:] != b[5:]:
        return False
    # token counts: relative to the batch's whole context (a tail growing by one token per step
    # is a large change of a small resident count, not of the step)
    scale = max(sum(a[1:4]), sum(b[1:4]), 1.0)
    if any(abs(x - y) > MEMO_TOLERANCE * scale for x, y in zip(a[1:4], b[1:4])):
        return False
    near = lambda x, y: abs(x - y) <= MEMO_TOLERANCE * max(abs(x), abs(y), 1.0)  # noqa: E731
    ca, cb = a[4], b[4]
    if (ca.cpu_fixed is None) != (cb.cpu_fixed is None):
        return False
    fields = ("cpu", "pcie", "gpu", "expert") + (("cpu_fixed",) if ca.cpu_fixed is not None else ())
    return all(near(getattr(ca, f), getattr(cb, f)) for f in fields)


def choose_spilled_region(n_c: int, n_spilled: int, target: float) -> Region:
    """C or T for the next spilled block of a sequence holding ``n_c`` C blocks out of
    ``n_spilled``: the one leaving its C fraction nearer ``target`` (ties: T)."""
    n = n_spilled + 1
    return Region.C if abs((n_c + 1) / n - target) < abs(n_c / n - target) else Region.T


@register_policy
class WriteScopePolicy(PlacementPolicy):
    name = "writescope"

    def __init__(self, profile: HardwareProfile | str | os.PathLike | None = None,
                 model_config=None, experts_on_cpu: "rl.ExpertsOnCpu" = False,
                 batch_hint: int | None = None,
                 feedback_alpha: float = 0.3, block_size: int | None = None,
                 verify_steps: int = 2, pipelined: bool = False, **_ignored: Any):
        if model_config is None:
            raise ValueError("kv_policy 'writescope' needs the model's config (model_config=...)")
        if profile is None or isinstance(profile, (str, os.PathLike)):
            profile = load_or_calibrate(None if profile is None else str(profile),
                                        model_config=model_config)
        self.profile = profile
        self.cfg = model_config
        #: the MoE layers whose routed experts run on the CPU (empty: none; the engine passes
        #: its per-layer placement, ``experts="auto"`` may put only some layers' there)
        self.experts_on_cpu = rl.cpu_expert_layers(model_config, experts_on_cpu)
        self.placement_cpu_margin = placement_cpu_margin()
        self.share_hold = share_hold()
        #: seq_id -> its T blocks the CPU read in place at its last assign() (share_hold)
        self._held: dict[int, int] = {}
        self.held_assigns = 0  # assign() calls that kept the last count (share_hold)
        #: decode steps with CPU attention run as two interleaved sub-batches (set by the
        #: engine from its runner): the model overlaps CPU attention with the GPU's dense work
        self.pipelined = bool(pipelined)
        self.batch_hint = int(batch_hint) if batch_hint else None
        self.feedback = RateFeedback(feedback_alpha)
        self.verify_steps = max(0, int(verify_steps))
        self.cpu_samples = 0  # decode steps in which the CPU attended blocks and was timed
        self.step_overhead_s = 0.0  # measured step time the per-path model does not explain
        self._overhead_outliers = 0  # steps in a row kept out of it (OVERHEAD_OUTLIER_RATIO)
        # tokens per block: from the constructor, else learnt from the first place() call
        # (the cache always places before it assigns blocks), else the default
        self.block_size: int | None = block_size
        self.token_bytes: float = float(model_config.kv_bytes_per_token())  # all layers
        # the batch as last seen: seq_id -> (num_tokens, regions of sealed blocks)
        self._view: dict[int, SeqKV] = {}
        self._batch: set[int] = set()       # sequences of the last finished step
        self._this_step: set[int] = set()   # sequences seen in the step under way
        #: admitted sequences (the cache's admit/release) -> their prompt's length: placement
        #: plans for the batch as it will be once every prompt is in
        self._expected: dict[int, int] = {}
        #: waiting requests the scheduler would admit next (``expect``) -> their prompt's length
        self._queued: dict[int, int] = {}
        self._gone: set[int] = set()  # released since the last observe()
        self._plan: dict[str, Any] | None = None
        self._assigned = {"cpu_c": 0, "cpu_t": 0, "streamed": 0}
        self._last: dict[str, float] = {}
        self.steps = 0
        self.skipped_steps = 0  # steps with prefill rows: no feedback from them
        self.host_bound_steps = 0  # decode steps whose GPU time was not used (HOST_BOUND_FRACTION)
        self._starts: list[int] = []  # per assign() this step: the sequence's tokens before it
        self.cpu_t_tokens_total = 0  # T tokens the CPU read in place, over all steps
        self._decode_without_cpu = 0  # decode steps since the CPU last attended (was timed)
        self.probes = 0  # steps planned at the uncorrected share to re-measure the CPU
        self._memo = None  # (planning state, (target share, step share, predicted step s))
        self._place_memo = None  # (placement's planning state, its target share)
        self._first_cpu_skipped = False
        #: distinct T blocks two or more of the step's sequences hold (``note_shared``): each
        #: holder's view counts them (``SeqKV.shared_t``), the link moves each once
        self._shared_distinct = 0
        #: the same of C blocks (``SeqKV.shared_c``): the CPU reads each once
        self._shared_distinct_c = 0
        #: id of a sealed-region tuple -> (the tuple, its G/C/T counts): see _counts; observe()
        #: keeps those of the batch's view
        self._region_counts: dict[int, tuple[tuple, tuple[int, int, int]]] = {}
        self.last_placement_target = math.nan  # the target share of the last place() call
        #: the last spilling place() calls: (seq_id, blocks, target, batch C blocks, batch
        #: spilled blocks after them) -- what the bench rows record of a prefill's placement
        self.placement_log: collections.deque = collections.deque(maxlen=64)

    # ------------------------------------------------------------------ the cache's questions
    def admit(self, seq_id: int, prompt_tokens: int) -> None:
        self._expected[seq_id] = max(0, int(prompt_tokens))

    def release(self, seq_id: int) -> None:
        # its blocks are free: placement no longer counts it; its view goes with the next
        # observe() (the step plan and stats() still show the batch that last ran)
        self._expected.pop(seq_id, None)
        self._held.pop(seq_id, None)
        self._gone.add(seq_id)

    def expect(self, queued: dict[int, int]) -> None:
        self._queued = {int(k): max(0, int(v)) for k, v in queued.items()}

    def place(self, seq: SeqKV, num_blocks: int, capacity: CacheCapacity) -> list[Region]:
        self._learn_geometry(capacity)
        self._see(seq)
        target = self._placement_target(seq, num_blocks, capacity)
        self.last_placement_target = target
        free = dict(capacity.free)
        # the batch's split, not this sequence's: a sequence placed earlier against another
        # target (a batch that has changed, an admission the projection did not foresee) is
        # made up for by the blocks placed now
        n_c = n_sp = 0
        listed = listed_c = 0  # shared T and C blocks, as often as sequences list them
        for i in self._batch_ids(seq.seq_id):
            regions = seq.regions if i == seq.seq_id else self._view[i].regions
            c = regions.count(Region.C)
            n_c += c
            n_sp += c + regions.count(Region.T)
            if i in self._view:
                listed += self._view[i].shared_t
                listed_c += self._view[i].shared_c
        # a shared block counts once, as in the target (_placement_target)
        extra_c = listed_c - min(listed_c, self._shared_distinct_c) if self._reads_once else 0
        n_sp -= listed - min(listed, self._shared_distinct) + extra_c
        n_c -= extra_c
        out: list[Region] = []
        for _ in range(num_blocks):
            if free.get(Region.G, 0) > 0:
                r = Region.G
            else:
                r = choose_spilled_region(n_c, n_sp, target)
                if free.get(r, 0) <= 0:
                    r = Region.T if r is Region.C else Region.C
                if free.get(r, 0) <= 0:
                    raise MemoryError("no free KV block in G, T or C")  # the cache checks first
                n_sp += 1
                n_c += r is Region.C
            free[r] -= 1
            out.append(r)
        if out.count(Region.G) < num_blocks:
            self.placement_log.append((seq.seq_id, num_blocks, round(target, 4), n_c, n_sp))
        # the view holds the sequence as it will be once these blocks are sealed
        old = self._view.get(seq.seq_id)
        self._view[seq.seq_id] = SeqKV(seq.seq_id, seq.num_tokens, tuple(seq.regions) + tuple(out),
                                       old.shared_t if old is not None else 0,
                                       old.shared_c if old is not None else 0)
        return out

    def _placement_target(self, seq: SeqKV, num_blocks: int, capacity: CacheCapacity) -> float:
        """The target share for the blocks being placed, with the batch as it will be once they
        are sealed and every admitted prompt, and every waiting one the scheduler would admit
        next, is in: blocks that do not fit in G's free blocks count as spilled, and so do the
        prompt tokens still to come past what G will have left (:meth:`admit`, :meth:`expect`;
        a sequence the cache did not announce counts as it stands). (The step
        plan counts a sequence's unsealed tokens as resident, and a prefill chunk's tokens are
        all unsealed: planned from it, the first chunk that spills would see no spill at all,
        and a prefill made of one chunk would put every spilled block in T. Planned from the
        prompts as they stand, each chunk of a chunked prefill would aim at a different target,
        and the early ones' C blocks would stay: four 32K DeepSeek-V2-Lite prompts prefilled one
        after another put 0.01 of their spill in C against a target of 0.48 for the batch they
        make; ``tests/test_planner.py``.)"""
        n_g = min(num_blocks, max(0, capacity.free.get(Region.G, 0)))
        if n_g == num_blocks:  # nothing spills: no C-or-T choice to make
            return self._current_plan(seq.seq_id)["target_share"]
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        prompts = {**self._queued, **self._expected}
        ids = self._batch_ids(seq.seq_id) | set(prompts)
        resident = spilled = future = 0.0
        for i in ids:
            if i == seq.seq_id:
                s = seq
                n_sealed = len(s.regions) + num_blocks
                n_gr = s.regions.count(Region.G) + n_g
            elif i in self._view:
                s = self._view[i]
                n_sealed, n_gr = len(s.regions), s.regions.count(Region.G)
            else:  # admitted or next in the queue, nothing placed yet
                s, n_sealed, n_gr = None, 0, 0
            tokens = s.num_tokens if s is not None else 0
            resident += n_gr * bs + max(0, tokens - n_sealed * bs)
            spilled += (n_sealed - n_gr) * bs
            future += max(0, prompts.get(i, 0) - max(tokens, n_sealed * bs))
        # the prompt tokens still to come take G's blocks left after these, then spill
        to_g = min(future, max(0, capacity.free.get(Region.G, 0) - n_g) * bs)
        resident += to_g
        spilled += future - to_g
        # shared T blocks stream once whatever the split; their other listings are HBM reads
        held = [self._view[i] for i in ids if i in self._view]
        listed, distinct = self._shared_tokens(held)
        resident += listed - distinct
        spilled -= listed + self._shared_c_excess(held)  # the CPU reads a shared C block once
        if self._reads_once:  # ... and a shared T block once: either side may read it
            spilled += distinct
            distinct = 0.0
        b = max(len(ids), self.batch_hint or 1)
        corr = self._placement_corrections(resident + spilled + distinct)
        state = (b, resident, spilled, 0.0, corr, self.pipelined, distinct)
        memo = self._place_memo
        if memo is not None and _close(memo[0], state):
            return memo[1]  # the batch within MEMO_TOLERANCE of the last solve (see _make_plan)
        share = rl.target_share(self.profile, self.cfg, b, resident, spilled, self.experts_on_cpu,
                                corr, pipelined=self.pipelined, fixed_t=distinct).cpu_share
        self._place_memo = (state, share)
        return share

    def _batch_ids(self, seq_id: int) -> set[int]:
        """The sequences of the batch being placed for that hold blocks (or are ``seq_id``): the
        last step's and this step's, and every admitted one."""
        ids = ((self._batch | self._this_step | set(self._expected)) & set(self._view)) - self._gone
        ids.add(seq_id)
        return ids

    def _placement_corrections(self, scale: float | None = None) -> rl.Corrections:
        """The rates placement plans with, for a batch of ``scale`` KV tokens: the corrected
        ones (:meth:`~.feedback.RateFeedback.corrections_at`), the GPU side's at most 1 and the
        CPU's per-byte rate :attr:`placement_cpu_margin` slower; until the CPU path is verified,
        a CPU at least ``UNVERIFIED_CPU_FACTOR`` times slower than its profile."""
        c = self.feedback.corrections_at(scale)
        # the GPU side's factor is timed with device events around its launches, so it also
        # counts the gaps of a host-bound step and a cold first step; above 1 it lets CPU
        # attention "hide" under GPU attention that is not there (a factor of 2.8 learnt in
        # the bench's warm-up put a DeepSeek 1M row's target share at 0.49 instead of 0.19;
        # its decode steps measured 1.2: 2026-12-01d call 4). Placement plans with the kernel.
        fixed = c.cpu if c.cpu_fixed is None else c.cpu_fixed
        # the CPU's per-byte rate with PLACEMENT_CPU_MARGIN: what C holds is the CPU's for good,
        # and a factor learnt before the batch's long-context steps ran has been optimistic
        c = dataclasses.replace(c, gpu=min(c.gpu, 1.0), cpu=c.cpu * self.placement_cpu_margin,
                                cpu_fixed=fixed)
        if self.cpu_verified:
            return c
        f = UNVERIFIED_CPU_FACTOR
        return dataclasses.replace(c, cpu=max(c.cpu, f), cpu_fixed=max(fixed, f))

    @property
    def step_min_gain(self) -> float:
        """The predicted gain for which a step's CPU side reads more than its C blocks (T in
        place): ``roofline.MIN_GAIN``; with the routed experts on the CPU, the placement's
        ``PLACEMENT_MIN_GAIN``. There the CPU runs the experts too, and the model leaves out
        how its attention and the link's copies share DRAM with them: DeepSeek-V2-Lite 8 x 128K,
        whose model gave a CPU share of ~0.17 a gain of 1%, ran 4-10% slower with the CPU
        attending 8% of its KV than transfer did (2026-12-01d calls 3-4)."""
        return rl.PLACEMENT_MIN_GAIN if self.experts_on_cpu else rl.MIN_GAIN

    @property
    def cpu_verified(self) -> bool:
        """Whether the CPU path's rate has been measured (see the module docstring)."""
        return self.cpu_samples >= self.verify_steps

    def assign(self, seq: SeqKV) -> int:
        """C blocks go to the CPU; so do the oldest ``n`` T blocks (returned), read in place, so
        that the streamed ones stay one run at the end of the sequence."""
        self._see(seq)
        self._starts.append(seq.num_tokens)
        plan = self._current_plan(seq.seq_id)
        _, n_c, n_t = self._counts(seq.regions)
        own = max(0, n_t - seq.shared_t)  # the cache gives the CPU its oldest private T blocks
        n_cpu_t = min(own, int(math.floor(plan["t_fraction_to_cpu"] * own + 0.5)))
        if self.share_hold > 0:
            last = self._held.get(seq.seq_id)
            hold = max(1, int(self.share_hold * own))
            if last is not None and last != n_cpu_t and last <= own and \
                    abs(n_cpu_t - last) <= hold:
                n_cpu_t = last
                self.held_assigns += 1
            self._held[seq.seq_id] = n_cpu_t
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        self._assigned["cpu_c"] += n_c * bs
        self._assigned["cpu_t"] += n_cpu_t * bs
        self._assigned["streamed"] += (n_t - n_cpu_t) * bs
        self.cpu_t_tokens_total += n_cpu_t * bs
        return n_cpu_t

    def note_shared(self, distinct_t_blocks: int, distinct_c_blocks: int = 0) -> None:
        n, n_c = max(0, int(distinct_t_blocks)), max(0, int(distinct_c_blocks))
        if (n, n_c) != (self._shared_distinct, self._shared_distinct_c):
            self._shared_distinct, self._shared_distinct_c = n, n_c
            self._plan = None  # planned without them (a plan made by place() this step)

    def _shared_tokens(self, seqs) -> tuple[float, float]:
        """``(listed, distinct)`` tokens of shared T blocks over ``seqs``' views: every holder
        lists a shared block, the link moves it once (at most as many as listed)."""
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        listed = float(sum(s.shared_t for s in seqs)) * bs
        return listed, min(listed, float(self._shared_distinct) * bs)

    def shared_t_to_cpu(self) -> int:
        """The step plan's count of distinct shared T blocks for the CPU (see the module
        docstring); asked after the step's ``assign`` calls, which made the plan."""
        if not self._shared_distinct or self._plan is None:
            return 0
        n = self._plan.get("shared_t_cpu_blocks", 0)
        self.cpu_t_tokens_total += n * (self.block_size or DEFAULT_BLOCK_SIZE)
        return n

    def _shared_c_excess(self, seqs) -> float:
        """Tokens of shared C blocks over ``seqs``' views that the CPU does not read: every
        listing of a shared C block but one (the kernel reads it once for all its holders)."""
        if not self._reads_once:
            return 0.0
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        listed = sum(s.shared_c for s in seqs)
        return float(listed - min(listed, self._shared_distinct_c)) * bs

    @property
    def _reads_once(self) -> bool:
        """Whether the CPU kernel reads a block several sequences list once for all of them,
        for this model's attention (``attention/shared_reads.py``: GQA by default)."""
        return shared_reads.active(self.cfg.is_mla)

    def observe(self, timing: dict[str, Any]) -> None:
        lengths = list(timing.get("batch_lengths") or [])
        # the model is of decode steps (one new token per sequence): a step that also ran
        # prefill rows does not say how fast decode runs, so it does not correct the rates
        starts, self._starts = self._starts, []
        decode = len(starts) == len(lengths) and all(e - s == 1 for s, e in zip(starts, lengths))
        # nor does a step closed before its device work was done (an overlapped decode step,
        # engine/inflight.py): its times are the host's alone
        if decode and not timing.get("untimed"):
            self._feedback(timing, lengths)
        else:
            self.skipped_steps += 1
            if decode:  # an overlapped step: predicted (lazily, for stats()), nothing learnt
                self._last = {"load": (self._load(timing, lengths), float(sum(lengths))),
                              "measured_step_s": math.nan}
        self.steps += 1
        # close the step: its sequences are the batch the next step is planned for
        self._batch = set(self._this_step)
        self._this_step.clear()
        self._view = {k: v for k, v in self._view.items()
                      if k in self._batch or k in self._expected}
        # counts of tuples nothing will ask about again go (a 128K sequence's is 16 KB)
        live = {id(v.regions) for v in self._view.values()}
        self._region_counts = {k: v for k, v in self._region_counts.items() if k in live}
        self._gone = {k for k in self._gone if k in self._view}
        self._assigned = {"cpu_c": 0, "cpu_t": 0, "streamed": 0}
        self._plan = None

    def _load(self, timing: dict[str, Any], lengths: list[int]) -> rl.StepLoad:
        """The step's load as it ran: tokens each side read (the timing's bytes)."""
        tb = self.token_bytes
        cpu_tok = float(timing.get("cpu_bytes", 0)) / tb
        gpu_tok = float(timing.get("gpu_bytes", 0)) / tb
        a = self._assigned
        if "t_bytes" in timing:
            streamed = float(timing["t_bytes"]) / tb
        else:
            streamed = float(a["streamed"])
        streamed = min(streamed, gpu_tok)
        if "cpu_t_bytes" in timing:  # the cache's count of T read in place
            t_frac = min(1.0, float(timing["cpu_t_bytes"]) / tb / cpu_tok) if cpu_tok else 0.0
        else:  # what assign() gave (the cache withholds T blocks other sequences hold too)
            assigned_cpu = a["cpu_c"] + a["cpu_t"]
            t_frac = a["cpu_t"] / assigned_cpu if assigned_cpu else 0.0
        return rl.StepLoad(max(1, len(lengths)), gpu_tok - streamed, streamed,
                           cpu_tok * (1 - t_frac), cpu_tok * t_frac)

    def _feedback(self, timing: dict[str, Any], lengths: list[int]) -> None:
        tb = self.token_bytes
        cpu_tok = float(timing.get("cpu_bytes", 0)) / tb
        load = self._load(timing, lengths)
        pl = self.pipelined
        scale = float(sum(lengths))  # the batch's KV tokens: the size the factors describe
        # this step's prediction, from what was known before it ran (out of sample)
        before = rl.predict_step(self.profile, self.cfg, load, self.experts_on_cpu,
                                 self.feedback.corrections_at(scale), pipelined=pl)
        predicted = before.step_s + max(0.0, self.step_overhead_s)
        raw = None  # the uncorrected model's times: only where a path was measured

        def uncorrected() -> rl.StepPrediction:
            nonlocal raw
            if raw is None:
                raw = rl.predict_step(self.profile, self.cfg, load, self.experts_on_cpu,
                                      pipelined=pl)
            return raw
        pcie_s = timing.get("pcie_s")
        cpu_s = timing.get("cpu_s")
        if (cpu_s or 0) > 0 and cpu_tok > 0:
            self._decode_without_cpu = 0
            if self.cpu_samples == 0 and not self._first_cpu_skipped and \
                    cpu_s > FIRST_CPU_SAMPLE_MAX_RATIO * uncorrected().cpu_attn_s:
                # the CPU side's first step may pay its start-up (thread team, first touches):
                # measured once on the H200 machine, such a step drove the CPU factor to a level
                # that kept the share at 0 for a whole run; a first step that far off the model
                # does not correct the rate (nor count toward verifying it)
                cpu_s = None
                self._first_cpu_skipped = True
            else:
                self.cpu_samples += 1
        else:
            self._decode_without_cpu += 1
        fixed = (self.cfg.num_layers * self.profile.attn_roundtrip_s(self.experts_on_cpu)
                 if cpu_tok > 0 else 0.0)
        gpu_s = timing.get("gpu_s")
        host_s, step_s = timing.get("host_s"), timing.get("step_s")
        if gpu_s is not None and host_s is not None and step_s and self.profile.has_gpu and \
                host_s >= HOST_BOUND_FRACTION * step_s:
            gpu_s = None  # a host-bound step: its GPU bracket holds the launching thread's gaps
            self.host_bound_steps += 1
        paths = {"cpu": cpu_s, "gpu": gpu_s, "pcie": pcie_s if pcie_s else None,
                 "expert": timing.get("cpu_expert_s")}
        corrected = before
        if any(v is not None and v > 0 for v in paths.values()):
            r = uncorrected()
            self.feedback.update(
                paths, {"cpu": r.cpu_attn_s, "gpu": r.gpu_attn_s, "pcie": r.pcie_s,
                        "expert": r.cpu_expert_s},
                cpu_split=(fixed, r.cpu_attn_s - fixed) if fixed else None, scale=scale)
            corrected = None  # the rates moved
        # (a step that measured no path -- all its KV on the GPU, in a CUDA graph -- keeps
        # every factor: one prediction serves, 0.2-0.3 ms of the host's step less)
        measured = timing.get("step_s")
        if measured is not None:
            # what the per-path model does not see (Python, launches, sampling): an additive
            # term, smoothed like the rates; it shifts the step time, not the best share
            if corrected is None:
                corrected = rl.predict_step(self.profile, self.cfg, load, self.experts_on_cpu,
                                            self.feedback.corrections_at(scale), pipelined=pl)
            a = self.feedback.alpha
            if timing.get("new_shape"):
                pass  # a step size's first, eager run (engine/runner.py): not a steady step
            elif float(measured) > OVERHEAD_OUTLIER_RATIO * predicted and \
                    self._overhead_outliers == 0:
                self._overhead_outliers = 1  # one step this far off is not the steps' overhead
            else:
                self._overhead_outliers = 0
                self.step_overhead_s = (1 - a) * self.step_overhead_s + a * (float(measured)
                                                                             - corrected.step_s)
        self._last = {"predicted_step_s": predicted,
                      "measured_step_s": float(measured) if measured is not None else math.nan}

    def stats(self) -> dict[str, Any]:
        plan = self._plan or self._make_plan(commit=False)
        c = self.feedback.corrections
        if "load" in self._last:  # an overlapped step's prediction, made when first asked for
            load, scale = self._last.pop("load")
            self._last["predicted_step_s"] = rl.predict_step(
                self.profile, self.cfg, load, self.experts_on_cpu,
                self.feedback.corrections_at(scale), pipelined=self.pipelined).step_s
        pred, meas = self._last.get("predicted_step_s", math.nan), self._last.get("measured_step_s", math.nan)
        return {
            "planner.cpu_share": plan["cpu_share"],
            "planner.target_share": plan["target_share"],
            "planner.placement_target": self.last_placement_target,
            "planner.planned_step_s": plan["predicted_step_s"],
            "planner.predicted_step_s": pred,
            "planner.measured_step_s": meas,
            "planner.prediction_error": (meas / pred - 1.0) if pred and pred == pred and meas == meas else math.nan,
            "planner.cpu_rate_correction": c.cpu,
            "planner.cpu_fixed_correction": c.cpu if c.cpu_fixed is None else c.cpu_fixed,
            "planner.pcie_rate_correction": c.pcie,
            "planner.gpu_rate_correction": c.gpu,
            "planner.expert_rate_correction": c.expert,
            "planner.steps": self.steps,
            "planner.prefill_steps": self.skipped_steps,
            "planner.host_bound_steps": self.host_bound_steps,
            "planner.cpu_read_t_tokens": self.cpu_t_tokens_total,
            # distinct shared T blocks the plan gives the CPU (read once for all holders)
            "planner.shared_t_cpu_blocks": plan.get("shared_t_cpu_blocks", 0),
            "planner.probes": self.probes,
            "planner.held_assigns": self.held_assigns,
            "planner.cpu_verified": self.cpu_verified,
            "planner.step_overhead_s": max(0.0, self.step_overhead_s),
        }

    # ------------------------------------------------------------------ planning
    def _counts(self, regions: tuple) -> tuple[int, int, int]:
        """``regions``' G, C and T blocks. A block table hands out the same tuple until one of
        its blocks seals, so the counts are kept per tuple: counting a 32K sequence's 512
        blocks three times over, in assign() and in the plan, for every sequence of every
        decode step, was a third of this policy's host time a step."""
        hit = self._region_counts.get(id(regions))
        if hit is not None and hit[0] is regions:
            return hit[1]
        c = (regions.count(Region.G), regions.count(Region.C), regions.count(Region.T))
        if isinstance(regions, tuple):  # (a list could change under the same id)
            self._region_counts[id(regions)] = (regions, c)  # kept: its id stays its own
        return c

    def _learn_geometry(self, capacity: CacheCapacity) -> None:
        self.block_size = capacity.block_size
        self.token_bytes = capacity.block_bytes / capacity.block_size

    def _see(self, seq: SeqKV) -> None:
        old = self._view.get(seq.seq_id)  # place() may already have shown this step's blocks
        if old is None or (len(seq.regions), seq.num_tokens) >= (len(old.regions), old.num_tokens):
            self._view[seq.seq_id] = seq
        elif (old.shared_t, old.shared_c) != (seq.shared_t, seq.shared_c):
            # assign() tells how many of its T and C blocks are shared
            self._view[seq.seq_id] = dataclasses.replace(old, shared_t=seq.shared_t,
                                                         shared_c=seq.shared_c)
        self._this_step.add(seq.seq_id)

    def _current_plan(self, seq_id: int) -> dict[str, Any]:
        """The step's plan; made anew once per step, or when a sequence joins the batch."""
        if self._plan is None or seq_id not in self._plan["members"]:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self, commit: bool = True) -> dict[str, Any]:
        """The plan for the current batch; ``commit=False`` (statistics) never starts a probe."""
        ids = (self._batch | self._this_step) & set(self._view)
        seqs = [self._view[i] for i in sorted(ids)]
        bs = self.block_size or DEFAULT_BLOCK_SIZE
        resident = c_tok = t_tok = 0.0
        for s in seqs:
            n_g, n_c, n_t = self._counts(s.regions)
            tail = max(0, s.num_tokens - len(s.regions) * bs)
            resident += n_g * bs + tail
            c_tok += n_c * bs
            t_tok += n_t * bs
        b = max(len(seqs), self.batch_hint or 1)
        corr = self.feedback.corrections_at(resident + c_tok + t_tok)
        # shared T blocks (prefix caching) stream once whatever the share; the GPU reads their
        # staged copy once per holder, from HBM: the listings past the first are resident
        listed, fixed = self._shared_tokens(seqs)
        resident += listed - fixed
        t_tok -= listed  # the T tokens either side may read: the private ones
        c_tok -= self._shared_c_excess(seqs)  # the CPU reads a shared C block once
        shared_t = 0.0  # distinct shared T tokens either side may read (each once)
        if self._reads_once:
            shared_t, fixed = fixed, 0.0
        private_t = t_tok
        t_tok += shared_t
        # (the form: the step-form chooser alternates them while it probes, and each has its
        # own solution)
        state = (b, resident, c_tok, t_tok, corr, self.pipelined, fixed)
        memo = self._memo
        if memo is not None and _close(memo[0], state):
            # a decode step later: lengths and rates within MEMO_TOLERANCE of the last solve,
            # whose shares stand (the optimiser costs ~0.5 ms of a host-bound step)
            target_share, share, predicted = memo[1]
        else:
            target_share = rl.target_share(self.profile, self.cfg, b, resident, c_tok + t_tok,
                                           self.experts_on_cpu, corr, pipelined=self.pipelined,
                                           fixed_t=fixed).cpu_share
            step = rl.optimal_cpu_share(self.profile, self.cfg, b, resident, c_tok, t_tok,
                                        self.experts_on_cpu, corr, pipelined=self.pipelined,
                                        min_gain=self.step_min_gain, fixed_t=fixed)
            share, predicted = step.cpu_share, step.prediction.step_s
            if commit:
                self._memo = (state, (target_share, share, predicted))
        spilled = c_tok + t_tok + fixed
        if commit and not self.cpu_verified and share * spilled <= c_tok and t_tok > 0 and \
                self.steps > 0:
            # placement waits for a measured CPU path, and a batch the model gives the CPU
            # nothing (one sequence, a short spill: its round trips would cost more than they
            # save) would never measure it -- a server that starts with such a batch, or a bench
            # row prefilled after a one-request warm-up, would keep every spilled block in T for
            # good. So until verified, read T blocks in place at the long-context share (a
            # handful of steps, each slower by about the CPU's round trips).
            probe = rl.bandwidth_ratio(self.profile, self.cfg)
            if probe * spilled > c_tok + bs:
                share = probe
                self.probes += 1
        elif commit and share * spilled <= c_tok and t_tok > 0 and \
                self._decode_without_cpu >= PROBE_EVERY and self.steps > 0:
            # the corrected rates give the CPU no T blocks, so nothing would ever re-measure
            # it: once in PROBE_EVERY decode steps, plan at the uncorrected model's share (the
            # CPU factor may be stale: one slow step, a neighbour that has left)
            fresh = rl.optimal_cpu_share(self.profile, self.cfg, b, resident, c_tok, t_tok,
                                         self.experts_on_cpu, pipelined=self.pipelined,
                                         min_gain=self.step_min_gain, fixed_t=fixed)
            self._decode_without_cpu = 0  # checked: the next check is PROBE_EVERY steps on
            if fresh.cpu_share * spilled > c_tok + bs:
                share = fresh.cpu_share
                self.probes += 1
        extra_t = max(0.0, share * spilled - c_tok)
        # the CPU's T: the shared blocks first (each once for all holders), then private ones
        shared_cpu = min(shared_t, extra_t)
        extra_t -= shared_cpu
        return {
            "members": ids,
            "target_share": target_share,
            "cpu_share": share,
            "predicted_step_s": predicted + max(0.0, self.step_overhead_s),
            "t_fraction_to_cpu": min(1.0, extra_t / private_t) if private_t else 0.0,
            "shared_t_cpu_blocks": int(math.floor(shared_cpu / bs + 0.5)),
        }
