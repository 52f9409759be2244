"""The decode step's form chosen from measured step times (engine/stepform.py,
WRITESCOPE_PIPELINE=auto)."""
from __future__ import annotations

import pytest

from writescope.engine.stepform import StepForms
from writescope.kvcache.subbatches import pipeline_mode


def drive(forms: StepForms, steps: int, seconds, n: int = 4) -> list[bool]:
    """Run ``steps`` steps, each taking ``seconds(split, i)``; the forms asked for, in order."""
    out = []
    for i in range(steps):
        split = forms.choose(n)
        out.append(split)
        forms.observe(n, split, seconds(split, i))
    return out


def test_probes_both_forms_not_counting_each_ones_first_step_then_holds_the_faster():
    f = StepForms(probe=2, hold=5, margin=0.02)
    seq = drive(f, 6, lambda split, i: 0.9 if split else 1.0)
    # one batch first (its first step uncounted), then the split form (idem), then one each
    assert seq == [False, False, True, True, False, True]
    assert f.stats()["4"] == {"choice": "pipelined", "single_ms": 1000.0,
                              "pipelined_ms": 900.0, "switches": 0, "prior": None,
                              "inherited": False, "hold": 5}
    assert drive(f, 5, lambda split, i: 0.9 if split else 1.0) == [True] * 5
    # after the hold, the other form twice, then the choice anew (unchanged here), which holds
    # twice as long before the next re-probe
    assert drive(f, 3, lambda split, i: 0.9 if split else 1.0) == [False, False, True]
    assert f.stats()["4"]["hold"] == 10
    assert drive(f, 11, lambda split, i: 0.9 if split else 1.0) == [True] * 9 + [False] * 2


def test_untimed_steps_count_toward_the_hold_and_the_timed_ones_are_named():
    """Overlapped steps have no time of their own (engine/inflight.py): the chooser names the
    steps that must be timed -- a new key, the probe, the last ``probe`` steps of a hold, the
    re-probe -- and the others, observed with ``seconds=None``, count toward the hold only. The
    same forms run as when every step is timed."""
    timed = StepForms(probe=2, hold=6, margin=0.02)
    mixed = StepForms(probe=2, hold=6, margin=0.02)
    sec = lambda split, i: 0.9 if split else 1.0  # noqa: E731
    assert mixed.needs_timing(4)
    want = drive(timed, 30, sec)
    got, untimed = [], []
    for i in range(30):
        split = mixed.choose(4)
        got.append(split)
        if mixed.needs_timing(4):
            mixed.observe(4, split, sec(split, i))
        else:
            untimed.append(i)
            mixed.observe(4, split, None)
    assert got == want
    # the probe (steps 0-5: each form's first step uncounted) is timed; then 4 of the hold's 6
    # are untimed, its last 2 timed, the re-probe's 2 timed; the next hold, 12 steps, likewise
    assert untimed == [6, 7, 8, 9] + list(range(14, 24)) + [28, 29]
    assert mixed.stats()["4"] == timed.stats()["4"] and timed.stats()["4"]["hold"] == 24
    with pytest.raises(TypeError):
        mixed.observe(4, True)  # seconds must be given (None for an untimed step)


def test_the_hold_doubles_while_re_probes_agree_and_resets_on_a_switch():
    f = StepForms(probe=1, hold=2, max_hold=8, keep=2)
    faster_split = lambda split, i: 0.8 if split else 1.0  # noqa: E731
    drive(f, 4, faster_split)  # probe: one batch twice (first uncounted), split twice
    holds = []
    for _ in range(5):  # hold, then one re-probe step
        holds.append(f.stats()["4"]["hold"])
        drive(f, holds[-1] + 1, faster_split)
    assert holds == [2, 4, 8, 8, 8]
    # the split form loses its edge: the next re-probe switches and the hold starts again
    drive(f, 9, lambda split, i: 1.3 if split else 1.0)
    st = f.stats()["4"]
    assert st["choice"] == "single" and st["switches"] == 1 and st["hold"] == 2


def test_the_split_form_must_win_by_the_margin():
    f = StepForms(probe=2, hold=50, margin=0.05)
    drive(f, 6, lambda split, i: 0.97 if split else 1.0)  # 3% faster: not enough
    assert f.stats()["4"]["choice"] == "single"
    assert drive(f, 10, lambda split, i: 0.97 if split else 1.0) == [False] * 10


def test_the_predicted_form_is_the_first_choices_incumbent():
    """With a prior (the planner's faster form), the first choice keeps it unless the other form
    is faster by the margin; the prior is asked for once, at the key's first step."""
    asked = []

    def prior(v):
        return lambda: asked.append(v) or v

    for want_split, split_s, single_s in ((True, 0.99, 1.0), (False, 1.0, 0.99)):
        f = StepForms(probe=2, hold=50, margin=0.02)
        for _ in range(8):  # 1% apart: within the margin, the prior stands
            split = f.choose(4, prior(want_split))
            f.observe(4, split, split_s if split else single_s)
        assert f.stats()["4"]["choice"] == ("pipelined" if want_split else "single")
        assert f.stats()["4"]["prior"] == ("pipelined" if want_split else "single")
    assert asked == [True, False]
    # without one, one batch is the incumbent: 1% faster split is not enough
    f = StepForms(probe=2, hold=50, margin=0.02)
    drive(f, 8, lambda split, i: 0.99 if split else 1.0)
    assert f.stats()["4"]["choice"] == "single"
    # a prior loses to a form faster by more than the margin
    f = StepForms(probe=2, hold=50, margin=0.02)
    for _ in range(8):
        split = f.choose(4, lambda: True)
        f.observe(4, split, 1.1 if split else 1.0)
    assert f.stats()["4"]["choice"] == "single"


def test_a_host_that_changes_is_followed_at_the_next_probe():
    f = StepForms(probe=2, hold=4, margin=0.02, keep=2)
    drive(f, 6, lambda split, i: 0.8 if split else 1.0)
    assert f.stats()["4"]["choice"] == "pipelined"
    # the split form loses its overlap: its own steps show it, and the re-probe switches
    seq = drive(f, 8, lambda split, i: 1.3 if split else 1.0)
    assert seq[:4] == [True] * 4 and seq[4:6] == [False, False]
    st = f.stats()["4"]
    assert st["choice"] == "single" and st["switches"] == 1 and seq[6:] == [False, False]


def test_each_batch_size_has_its_own_choice_and_a_declined_split_counts_as_one_batch():
    f = StepForms(probe=1, hold=10)
    drive(f, 4, lambda split, i: 0.5 if split else 1.0, n=2)
    drive(f, 4, lambda split, i: 2.0 if split else 1.0, n=8)
    st = f.stats()
    assert st["2"]["choice"] == "pipelined" and st["8"]["choice"] == "single"
    # asked to split, the step ran as one batch (nothing to overlap): it is that form's step
    g = StepForms(probe=1, hold=10)
    for _ in range(5):
        assert g.choose(3) in (False, True)
        g.observe(3, False, 1.0)
    assert g.stats()["3"] == {"choice": None, "single_ms": 1000.0, "pipelined_ms": None,
                              "switches": 0, "prior": None, "inherited": False, "hold": 0}
    assert g.choose(3) is True  # still probing: asks for the form it has not seen


def test_a_doubled_context_starts_from_the_related_keys_choice():
    """A new key whose related key (the batch at half the context) has chosen holds that form at
    once -- no steps in the slower form -- until its first re-probe, which checks it here."""
    f = StepForms(probe=2, hold=4, margin=0.02)
    faster_split = lambda split, i: 0.8 if split else 1.0  # noqa: E731

    def run(key, n, seconds, related=None, prior=None):
        out = []
        for i in range(n):
            split = f.choose(key, prior, related=related)
            out.append(split)
            f.observe(key, split, seconds(split, i))
        return out
    run("16K", 6, faster_split)
    assert f.stats()["16K"]["choice"] == "pipelined"
    # held from the first step, each counted; after the hold the other form is probed (its
    # first step uncounted), and the choice is made from this key's own times
    seq = run("32K", 4, faster_split, related="16K")
    assert seq == [True] * 4 and f.stats()["32K"]["inherited"] is True
    assert f.stats()["32K"]["pipelined_ms"] == 800.0 and f.stats()["32K"]["single_ms"] is None
    assert run("32K", 3, faster_split, related="16K") == [False, False, False]
    st = f.stats()["32K"]
    assert st["choice"] == "pipelined" and st["inherited"] is False and st["single_ms"] == 1000.0
    assert st["hold"] == 8  # the re-probe kept the choice: held twice as long
    # where the split form lost its edge at the longer context, the re-probe (after the hold
    # the key inherited) switches
    slower_split = lambda split, i: 1.2 if split else 1.0  # noqa: E731
    assert run("64K", 8, slower_split, related="32K") == [True] * 8
    assert run("64K", 3, slower_split, related="32K") == [False] * 3
    st = f.stats()["64K"]
    assert st["choice"] == "single" and st["switches"] == 1 and st["hold"] == 4
    # a related key still probing, or a prior that disagrees, leaves a new key to probe
    g = StepForms(probe=2, hold=4)
    g.choose("a")
    g.observe("a", False, 1.0)
    assert g.choose("b", related="a") is False and "b" not in g.stats()  # nothing seen yet
    assert run("128K", 1, faster_split, related="64K", prior=lambda: True) == [False]
    assert f.stats()["128K"]["choice"] is None and f.stats()["128K"]["prior"] == "pipelined"
    assert run("128K", 1, faster_split, related="64K") == [False]  # asked once: still probing


@pytest.mark.parametrize("bad", [dict(probe=0), dict(hold=0), dict(probe=3, keep=2),
                                 dict(hold=10, max_hold=5),
                                 dict(margin=1.0), dict(margin=-0.1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="step forms"):
        StepForms(**bad)


def test_the_environment_variable_names_three_modes(monkeypatch):
    for v, want in (("0", "off"), ("", "off"), ("off", "off"), ("1", "on"), ("on", "on"),
                    ("auto", "auto"), (" AUTO ", "auto")):
        monkeypatch.setenv("WRITESCOPE_PIPELINE", v)
        assert pipeline_mode() == want
    monkeypatch.delenv("WRITESCOPE_PIPELINE")
    assert pipeline_mode() == "off"
    monkeypatch.setenv("WRITESCOPE_PIPELINE", "sometimes")
    with pytest.raises(ValueError, match="WRITESCOPE_PIPELINE"):
        pipeline_mode()
