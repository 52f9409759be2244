"""Online feedback: measured step times correct the rates the roofline plans with.

After each step the engine reports how long each path was busy (``cpu_s``, ``pcie_s``,
``gpu_s``, optionally ``cpu_expert_s``) and how many bytes it read. The planner predicts the same
quantities *for the same bytes* with the uncorrected profile; the ratio measured/predicted of each
path is smoothed by an exponential moving average and becomes that path's
:class:`~writescope.planner.roofline.Corrections` factor (a time multiplier: 2.0 means the path
runs at half the profile's rate). A sustained change of a ratio r is followed geometrically: after
n steps the factor has moved ``1 - (1 - alpha)^n`` of the way (alpha = 0.3: 97 % in 10 steps),
while a single noisy step moves it by ``alpha`` of its error only. Ratios are clamped to
``[1/16, 16]`` so one absurd sample (a page fault storm, the first step's warm-up) cannot wreck
the model, and paths that did (almost) nothing this step are not updated.

The CPU attention time has two parts with different causes: a fixed cost per layer call (the
hand-over to the worker thread, thread wake-up, the merge) and a cost per byte read. One factor
for both fits the operating point it was measured at and mispredicts every other share: on the
H200 machine the in-engine CPU side cost ~1.5 ms per layer call against a 0.7 ms round trip in the
profile, while its per-byte rate was close to the calibrated one (bench/results/2026-11-30-h200/).
So when the caller passes the predicted split (``cpu_split``), the *shape* ``a/b`` of
``measured = a * fixed + b * per_byte`` is fitted by exponentially weighted least squares over a
longer memory (``fit_memory`` steps, ridge-regularised toward ``a = b`` = the single factor; steps
that all sit at one share are not used) and replaces the single factor once it rests on
``RESET_AFTER`` samples. A measurement that the fitted model misses by more than 25% (a slowdown,
a new tenant) starts the fit over, and the fast single factor takes over until then.

A factor describes the size of step it was measured at. The attention paths' factors
(``SCALED``) are learnt with the step's *scale* (the batch's KV tokens) and, for a larger step,
extrapolated as a fixed excess: a factor ``f`` learnt at scale ``s`` stands for ``(f - 1) * s``
worth of time beyond the profile's, so at scale ``S > s`` it is ``1 + (f - 1) * s / S``
(:meth:`RateFeedback.corrections_at`; a sample at a larger scale rescales the factor the same
way before it is blended in). A bench's warm-up decodes short requests (a few sequences of 64
tokens: launch gaps, KV in the L3) before steps at full scale, and without the scale what they
left in the factors carried into the rows: GPU factors of 1.2-2.9 when a row's prefill began
(the step plan then let CPU attention "hide" under GPU time a 1M-token step does not have:
DeepSeek-V2-Lite 8 x 128K read 8-11% of its KV on the CPU for five decode steps, each ~10%
slower than transfer's), and CPU factors of 0.64-0.76 (one put 0.63 of a Qwen3 2 x 128K spill
in C; 2026-12-01f-h200 calls 1-2). With it, rows began with GPU factors of 0.74-0.88 (calls
3-4). The profile's own rates were calibrated at DRAM-sized arrays: toward them is the
direction a larger step goes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .roofline import Corrections

PATHS = ("cpu", "pcie", "gpu", "expert")
#: the paths whose cost grows with the batch's KV (the routed experts' does not)
SCALED = ("cpu", "pcie", "gpu")
CLAMP = (1.0 / 16, 16.0)
#: a prediction below this is too small to compare with a wall-clock measurement
MIN_PREDICTED_S = 20e-6
#: the CPU cost-shape fit starts over when, after this many samples, a measurement misses its
#: prediction by more than RESET_ERROR (the machine changed: another tenant, a slowdown)
RESET_AFTER, RESET_ERROR = 5, 0.25


@dataclass
class RateFeedback:
    alpha: float = 0.3
    fit_memory: float = 30.0  # steps: the e-folding memory of the CPU cost-shape fit
    ridge: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"feedback alpha must be in [0, 1], got {self.alpha}")
        if self.fit_memory < 1:
            raise ValueError(f"fit_memory must be >= 1 step, got {self.fit_memory}")
        self.factors = {p: 1.0 for p in PATHS}
        #: per SCALED path, the scale (batch KV tokens) its factor describes (None: not learnt)
        self.scale: dict[str, float | None] = {p: None for p in SCALED}
        self.last_ratio: dict[str, float] = {}
        self.updates = {p: 0 for p in PATHS}
        # EMA-weighted normal equations of measured = a*f + b*v (f, v: predicted fixed, per-byte)
        self._ff = self._fv = self._vv = self._fm = self._vm = 0.0
        self._n, self._ab = 0, None  # samples since the last reset, fitted (a, b)

    def update(self, measured: dict[str, float | None], predicted: dict[str, float],
               cpu_split: tuple[float, float] | None = None, scale: float | None = None) -> None:
        """``measured`` and ``predicted`` map path names (see ``PATHS``) to seconds; a path that
        was not measured (``None`` or missing) keeps its factor. ``cpu_split``: the uncorrected
        prediction of the CPU attention time as (fixed per-layer part, per-byte part).
        ``scale``: the step's size (the batch's KV tokens; None: not scale-aware)."""
        for p in PATHS:
            m, q = measured.get(p), predicted.get(p, 0.0)
            if m is None or m <= 0 or q < MIN_PREDICTED_S:
                continue
            r = min(max(m / q, CLAMP[0]), CLAMP[1])
            self.last_ratio[p] = r
            if scale and p in SCALED:
                self._rescale(p, float(scale))
            self.factors[p] = (1 - self.alpha) * self.factors[p] + self.alpha * r
            self.updates[p] += 1
            if p == "cpu" and cpu_split is not None:
                self._fit_cpu(m, *cpu_split)

    def _rescale(self, p: str, scale: float) -> None:
        """Before a sample of ``scale`` is blended in: a larger step takes the factor to its
        scale (the fixed-excess extrapolation); a smaller one moves the scale toward its own,
        as the blend moves the factor."""
        s = self.scale[p]
        if s is None:
            self.scale[p] = scale
        elif scale > s:
            self.factors[p] = toward_one(self.factors[p], s / scale)
            self.scale[p] = scale
        else:
            self.scale[p] = (1 - self.alpha) * s + self.alpha * scale

    def _fit_cpu(self, m: float, f: float, v: float) -> None:
        if f <= 0 or v <= 0:
            return
        if self._ab is not None and self._n >= RESET_AFTER:
            a, b = self._ab
            if abs(m - (a * f + b * v)) > RESET_ERROR * m:  # the machine changed: start over
                self._ff = self._fv = self._vv = self._fm = self._vm = 0.0
                self._n, self._ab = 0, None
        lam = 1.0 - 1.0 / self.fit_memory
        self._ff = lam * self._ff + f * f
        self._fv = lam * self._fv + f * v
        self._vv = lam * self._vv + v * v
        self._fm = lam * self._fm + f * m
        self._vm = lam * self._vm + v * m
        self._n += 1
        # fixed and per-byte parts that always moved together say nothing about the shape
        if 1.0 - self._fv * self._fv / (self._ff * self._vv) < 1e-3:
            return
        # ridge toward a = b = the single factor: weakly informative directions keep the prior
        c = self.factors["cpu"]
        rf, rv = self.ridge * self._ff, self.ridge * self._vv
        s11, s12, s22 = self._ff + rf, self._fv, self._vv + rv
        y1, y2 = self._fm + rf * c, self._vm + rv * c
        det = s11 * s22 - s12 * s12
        if det <= 1e-12 * s11 * s22:
            return
        a = (y1 * s22 - s12 * y2) / det
        b = (s11 * y2 - s12 * y1) / det
        if a <= 0 or b <= 0:
            return
        self._ab = (a, b)

    @property
    def corrections(self) -> Corrections:
        f = dict(self.factors)
        if self._ab is None or self._n < RESET_AFTER:
            return Corrections(**f)
        a, b = self._ab  # the fitted parts, once the fit has enough samples since its start
        f["cpu"] = min(max(b, CLAMP[0]), CLAMP[1])
        return Corrections(**f, cpu_fixed=min(max(a, CLAMP[0]), CLAMP[1]))

    def corrections_at(self, scale: float | None) -> Corrections:
        """The corrections for a step of ``scale`` batch KV tokens: those of
        :attr:`corrections`, each ``SCALED`` factor learnt at a smaller scale taken to this
        one (``1 + (f - 1) * learnt / scale``); the CPU's fixed per-layer part stays."""
        c = self.corrections
        if not scale:
            return c
        kw = {p: toward_one(getattr(c, p), s / scale) for p, s in self.scale.items()
              if s is not None and scale > s}
        if kw and c.cpu_fixed is None and "cpu" in kw:
            kw["cpu_fixed"] = c.cpu  # the round trip's factor is not a per-byte one
        return dataclasses.replace(c, **kw) if kw else c

    def reset(self) -> None:
        self.__post_init__()


def toward_one(factor: float, weight: float) -> float:
    """A factor's excess over the profile, ``factor - 1``, kept in the proportion ``weight``."""
    return 1.0 + (factor - 1.0) * weight
