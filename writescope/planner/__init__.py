"""WriteScope, the planner: hardware profile, roofline model, feedback, write-time placement.

* :mod:`.profile` -- the measured ceilings of this machine (versioned JSON), and finding one;
* :mod:`.calibrate` -- measuring them (``writescope calibrate``);
* :mod:`.roofline` -- the model: predicted step time and the best CPU share, pure functions;
* :mod:`.feedback` -- measured/predicted ratios, smoothed, correcting the model's rates;
* :mod:`.placement` -- ``kv_policy="writescope"``: where new blocks go and who attends what.

Importing this package registers the ``writescope`` policy with the cache's policy registry.
"""
from .feedback import RateFeedback
from .placement import WriteScopePolicy
from .profile import HardwareProfile, load_or_calibrate
from .roofline import Corrections, StepLoad, optimal_cpu_share, predict_step, target_share

__all__ = ["HardwareProfile", "load_or_calibrate", "RateFeedback", "WriteScopePolicy",
           "Corrections", "StepLoad", "optimal_cpu_share", "predict_step", "target_share"]
