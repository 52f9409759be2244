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
"""
from __future__ import annotations

from dataclasses import dataclass

from .roofline import Corrections

PATHS = ("cpu", "pcie", "gpu", "expert")
CLAMP = (1.0 / 16, 16.0)
#: a prediction below this is too small to compare with a wall-clock measurement
MIN_PREDICTED_S = 20e-6


@dataclass
class RateFeedback:
    alpha: float = 0.3

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"feedback alpha must be in [0, 1], got {self.alpha}")
        self.factors = {p: 1.0 for p in PATHS}
        self.last_ratio: dict[str, float] = {}
        self.updates = {p: 0 for p in PATHS}

    def update(self, measured: dict[str, float | None], predicted: dict[str, float]) -> None:
        """``measured`` and ``predicted`` map path names (see ``PATHS``) to seconds; a path that
        was not measured (``None`` or missing) keeps its factor."""
        for p in PATHS:
            m, q = measured.get(p), predicted.get(p, 0.0)
            if m is None or m <= 0 or q < MIN_PREDICTED_S:
                continue
            r = min(max(m / q, CLAMP[0]), CLAMP[1])
            self.last_ratio[p] = r
            self.factors[p] = (1 - self.alpha) * self.factors[p] + self.alpha * r
            self.updates[p] += 1

    @property
    def corrections(self) -> Corrections:
        return Corrections(**self.factors)

    def reset(self) -> None:
        self.__post_init__()
