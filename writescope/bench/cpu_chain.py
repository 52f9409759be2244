"""One decode step's CPU work as one chain: the CPU attention queue's kernels and the CPU expert
queue's, in time order, and the cores' idle time between them by what they waited for.

In a spilled step with the routed experts on the CPU, each layer's CPU attention and then its
experts run on the same cores, and each waits for the device's work in between: an attention
kernel ends -> the device merges it with its own partials (which need the layer's staged T
blocks), projects and routes -> the layer's experts start; the experts end -> the device adds,
normalises and projects the next layer's queries -> that layer's attention starts. Such a step
lasts its kernels plus those waits plus its start and end outside the chain; :func:`cpu_chain`
splits it so (``bench.step_profile --timeline``).

The intervals are each queue's own (:meth:`~writescope.attention.cpu.CpuJobQueue.times`: a
kernel's start, once its inputs are ready and the cores are taken, to its end), on the clock
of :func:`time.perf_counter`."""
from __future__ import annotations


def cpu_chain(attention: list[tuple[float, float]], experts: list[tuple[float, float]],
              t0: float, t1: float) -> dict:
    """The step from ``t0`` to ``t1`` (seconds) along its CPU kernels: ``attention`` and
    ``experts`` are each queue's ``(start, end)`` intervals. Returns milliseconds:

    * ``attention_ms`` / ``experts_ms``: the kernels' time (``attention_calls``,
      ``expert_calls``);
    * ``att_to_exp_ms`` (``att_to_exp`` waits): the cores idle from an attention kernel's end to
      an expert kernel's start -- the device's merge, projection and routing, and the hand-off;
    * ``exp_to_att_ms`` (``exp_to_att`` waits): from an expert kernel's end to an attention
      kernel's start -- the device's work up to the next layer's queries, and the hand-off;
    * ``same_kind_gap_ms``: idle between two kernels of one kind (a second call of a layer);
    * ``before_ms`` / ``after_ms``: the step before its first kernel and after its last;
    * ``overlap_ms``: time with both queues' kernels running at once (split steps), counted
      once in the sum below.

    ``before + attention + experts - overlap + the three gaps + after`` is the step."""
    ev = sorted([(a, b, "att") for a, b in attention] + [(a, b, "exp") for a, b in experts])
    ms = 1e3
    out = {"step_ms": (t1 - t0) * ms, "attention_calls": len(attention),
           "expert_calls": len(experts),
           "attention_ms": sum(b - a for a, b in attention) * ms,
           "experts_ms": sum(b - a for a, b in experts) * ms,
           "att_to_exp_ms": 0.0, "exp_to_att_ms": 0.0, "same_kind_gap_ms": 0.0,
           "att_to_exp": 0, "exp_to_att": 0, "overlap_ms": 0.0,
           "before_ms": 0.0, "after_ms": 0.0}
    if not ev:
        out["before_ms"] = out["step_ms"]
        return out
    out["before_ms"] = (ev[0][0] - t0) * ms
    end, kind = ev[0][1], ev[0][2]  # where the busy time so far ends, and whose kernel ends it
    for a, b, k in ev[1:]:
        if a >= end:
            gap = (a - end) * ms
            if kind == k:
                out["same_kind_gap_ms"] += gap
            else:
                name = "att_to_exp" if kind == "att" else "exp_to_att"
                out[name + "_ms"] += gap
                out[name] += 1
        else:
            out["overlap_ms"] += (min(b, end) - a) * ms
        if b > end:
            end, kind = b, k
    out["after_ms"] = (t1 - end) * ms
    return out


def print_cpu_chain(c: dict) -> None:
    """One line (two) for :func:`cpu_chain`'s figures (a step's, or the median of several)."""
    if not c.get("attention_calls") and not c.get("expert_calls"):
        return
    n1, n2 = max(c["att_to_exp"], 1), max(c["exp_to_att"], 1)
    print(f"\nCPU chain (median of the unprofiled steps): step {c['step_ms']:.1f} ms = before the "
          f"first kernel {c['before_ms']:.1f} + attention kernels {c['attention_ms']:.1f} "
          f"({c['attention_calls']:.0f} calls) + expert kernels {c['experts_ms']:.1f} "
          f"({c['expert_calls']:.0f} calls) - overlap {c['overlap_ms']:.1f}")
    print(f"  + waits attention -> experts {c['att_to_exp_ms']:.1f} ({c['att_to_exp']:.0f}, "
          f"{c['att_to_exp_ms'] / n1 * 1e3:.0f} us each) + experts -> attention "
          f"{c['exp_to_att_ms']:.1f} ({c['exp_to_att']:.0f}, {c['exp_to_att_ms'] / n2 * 1e3:.0f}"
          f" us each) + between kernels of one kind {c['same_kind_gap_ms']:.1f} + after the "
          f"last kernel {c['after_ms']:.1f}")
