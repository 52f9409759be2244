"""Which form a decode step runs in, chosen from measured step times (``WRITESCOPE_PIPELINE=auto``).

A decode step whose CPU side has work can run as one batch, or as two interleaved sub-batches
(``graphs.pipelined_pieces``: one sub-batch's CPU attention overlapping the other's GPU work).
Which is faster depends on the model and on the host, and on the H200 it moved from call to
call: Qwen3-30B-A3B 2 x 128K ran 8% faster split on one host and no faster, or slower, on the
next; DeepSeek-V2-Lite 4 x 128K ran 6-8% slower split on every host (its dense work is run once
per sub-batch). So the runner asks this chooser, per key (a batch's size and its context to
the power of two below it, ``runner.step_form_key``):

* **probe**: the two forms alternate until each has ``probe`` timed steps. A form's first step
  at a key is not counted (at a new batch size it runs eagerly, before its CUDA graphs are
  captured);
* **hold**: the faster by median runs ``hold`` steps (the other form only when it is faster by
  more than ``margin`` than the incumbent: at the first choice the form the planner predicts
  faster where the runner gives a prior -- split expert steps, ``WRITESCOPE_PIPELINE_EXPERTS``
  -- else one batch; from then on, the form chosen);
* **re-probe**: then the other form runs ``probe`` steps again and the choice is made anew from
  each form's latest ``keep`` steps, so a host that changes under the run is followed. Each
  re-probe that keeps the choice doubles the hold, up to ``max_hold`` steps; one that switches
  sets it back to ``hold``. (A re-probe runs ``probe`` steps in the slower form: 2 of every 26
  at the base hold, 4 ms each for Qwen3-30B-A3B FP8 4 x 8K on an H100 host, 15.3 ms one batch
  against 11.2 split; 2 of every 194 at the longest.)
* **inherit**: a key whose batch at half its context (``related``: the key the runner gave
  before the context doubled) has a choice starts holding that form instead of probing, unless
  the planner's prior says otherwise; its first re-probe checks it. A long decode crossed each
  doubling with ~3 steps in the slower form: Qwen3-30B-A3B FP8 4 x 8K on an H100 host chose
  the split form at 16K (11.3 ms against 15.4 one batch) and probed one batch again at 32K
  (bench/results/2026-12-06-h100).

* **untimed steps**: an overlapped decode step (``engine/inflight.py``) is closed before its
  device work is done, so it has no time of its own. The chooser says which steps must be
  timed (:meth:`StepForms.needs_timing`: while it probes, and the last ``probe`` steps of a
  hold, which give the incumbent fresh times for the re-probe's comparison); the runner runs
  those synchronously, and the others count toward the hold untimed (``observe`` with
  ``seconds=None``).

With two timed steps a form the first choice sees a few percent of noise: DeepSeek-V2-Lite
4 x 32K with six layers' experts on the CPU kept one batch at 28.6 ms against the split form's
27.0 (bench/results/2026-12-06-h200), when one batch was the incumbent whatever the planner
predicted.
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

#: timed steps of each form before a choice (and of the other form at each re-probe)
PROBE_STEPS = 2
#: steps the chosen form runs before the other is probed again
HOLD_STEPS = 24
#: the other form must be this much faster (by median) to be chosen
MARGIN = 0.02
#: latest steps of each form the choice looks at
KEEP_STEPS = 4
#: the longest hold, after re-probes that kept the choice (each doubles it)
MAX_HOLD_STEPS = 192


@dataclass
class _State:
    """The chooser's state for one key."""
    times: dict  # form (split or not) -> its latest step seconds
    seen: dict = field(default_factory=lambda: {False: 0, True: 0})
    choice: bool | None = None  # None: probing for the first time
    held: int = 0               # steps of the chosen form since the last choice
    reprobe: int = 0            # steps of the other form still to run
    switches: int = 0
    prior: bool | None = None   # the form predicted faster (the first choice's incumbent)
    inherited: bool = False     # the choice came from the related key's (not yet re-probed)
    hold: int = 0               # steps to hold the choice before the next re-probe


class StepForms:
    """Per key (a batch: ``runner.step_form_key``): whether the next decode step should run
    split (:meth:`choose`), and the measured seconds of each step that ran (:meth:`observe`)."""

    def __init__(self, probe: int = PROBE_STEPS, hold: int = HOLD_STEPS, margin: float = MARGIN,
                 keep: int = KEEP_STEPS, max_hold: int | None = None):
        max_hold = max(hold, MAX_HOLD_STEPS) if max_hold is None else max_hold
        if probe < 1 or hold < 1 or keep < probe or not 0.0 <= margin < 1.0 or max_hold < hold:
            raise ValueError(f"step forms: probe {probe}, hold {hold}, max_hold {max_hold}, keep "
                             f"{keep} and margin {margin} must satisfy 1 <= probe <= keep, "
                             "1 <= hold <= max_hold, 0 <= margin < 1")
        self.probe, self.hold, self.margin, self.keep = probe, hold, margin, keep
        self.max_hold = max_hold
        self._states: dict[Hashable, _State] = {}

    def _state(self, key: Hashable) -> _State:
        s = self._states.get(key)
        if s is None:
            s = self._states[key] = _State({f: deque(maxlen=self.keep) for f in (False, True)})
        return s

    def choose(self, key: Hashable, prior: Callable[[], bool | None] | None = None,
               related: Hashable | None = None) -> bool:
        """Whether the next decode step of this key should run as two sub-batches. ``prior``:
        called once, at the key's first step, for the form predicted faster (True: split),
        the incumbent of the first choice (None: one batch). ``related``: the key of the same
        batch at half the context, whose choice a new key starts from (see the module
        docstring) where the prior does not contradict it."""
        if key not in self._states:
            if prior is not None:
                self._state(key).prior = prior()
            near = self._states.get(related) if related is not None else None
            if near is not None and near.choice is not None:
                s = self._state(key)
                if s.prior is None or s.prior == near.choice:
                    s.choice, s.inherited, s.hold = near.choice, True, near.hold
        s = self._states.get(key)
        if s is None:  # nothing seen yet (the state is made by the first step observed)
            return False
        if s.choice is None:  # the form with fewer counted steps; one batch first
            return len(s.times[True]) < len(s.times[False])
        return (not s.choice) if s.reprobe > 0 else s.choice

    def needs_timing(self, key: Hashable) -> bool:
        """Whether the next step of this key must be timed (run synchronously): the key is new
        or still probing, a re-probe is running, or the hold is in its last ``probe`` steps."""
        s = self._states.get(key)
        return (s is None or s.choice is None or s.reprobe > 0
                or s.held >= s.hold - self.probe)

    def observe(self, key: Hashable, split: bool, seconds: float | None) -> None:
        """A decode step of this key ran (``split``: as two sub-batches) in ``seconds`` (None:
        an untimed, overlapped step, which counts toward the hold only). (A step that could not
        have been split, with no CPU work to overlap, is not shown here.)"""
        s = self._state(key)
        s.seen[split] += 1
        if seconds is None:
            if s.choice is not None and split == s.choice and s.reprobe == 0:
                s.held += 1
                if s.held >= s.hold:
                    s.held, s.reprobe = 0, self.probe
            return
        if s.seen[split] == 1 and not (s.inherited and split == s.choice):
            # eager, before the form's graphs were captured: not this form's speed (an inherited
            # form has run at this batch size already)
            return
        s.times[split].append(float(seconds))
        if s.choice is None:
            if min(len(s.times[False]), len(s.times[True])) >= self.probe:
                self._decide(s)
        elif split != s.choice:
            if s.reprobe > 0:
                s.reprobe -= 1
                if s.reprobe == 0:
                    self._decide(s)
        else:
            s.held += 1
            if s.held >= s.hold:
                s.held, s.reprobe = 0, self.probe

    def _decide(self, s: _State) -> None:
        med = {f: statistics.median(s.times[f]) for f in (False, True)}
        cur = bool(s.prior) if s.choice is None else s.choice
        new = (not cur) if med[not cur] < med[cur] * (1.0 - self.margin) else cur
        if s.choice is None or new != s.choice:
            s.switches += s.choice is not None
            s.hold = self.hold
        else:  # a re-probe kept the choice: the next one comes later
            s.hold = min(2 * s.hold, self.max_hold)
        s.choice, s.held, s.reprobe, s.inherited = new, 0, 0, False

    def stats(self) -> dict:
        """Per key: the form chosen (``None`` while first probing), the median ms of each
        form's latest steps, how often the choice switched, the form predicted faster
        (``None`` where no prior was given), whether the choice is still the related key's
        (``inherited``: not yet re-probed here), and the steps it is held between re-probes."""
        out = {}
        for key, s in self._states.items():
            ms = {f: (round(1e3 * statistics.median(s.times[f]), 2) if s.times[f] else None)
                  for f in (False, True)}
            out[str(key)] = {"choice": None if s.choice is None else
                           ("pipelined" if s.choice else "single"),
                           "single_ms": ms[False], "pipelined_ms": ms[True],
                           "switches": s.switches,
                           "prior": None if s.prior is None else
                           ("pipelined" if s.prior else "single"),
                           "inherited": s.inherited, "hold": s.hold}
        return out
