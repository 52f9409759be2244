"""Where a spilled decode step leaves the host-to-device link idle (``bench.step_profile``).

The staging ring streams a step's T blocks over PCIe; where the planner gives the link a share
that takes about as long as the CPU's, the step cannot be shorter than the link's busy time,
and every moment the link waits adds to it. The hybrid attention's timed steps (one in
``WRITESCOPE_TIMING_EVERY``) record, on the device's clock from the step's start event: the
first copy's start, the last copy's end, the step's end, and the copy stream's busy seconds.
:func:`link_split` turns them into the link's idle time before its first copy, between copies
(the ring full, waiting for a slot's consumer), after its last copy, and the host's time
outside the device's step (the wall step less the device's span: scheduling, the step plan,
the outputs). The parts sum to the wall step. With units staged ahead
(``WRITESCOPE_STAGING_AHEAD=1``) the step's first copies began in the step before: the time
"before its first copy" is then negative."""
from __future__ import annotations


def link_split(timing: dict, wall_s: float) -> dict | None:
    """One timed step's link figures in ms, or None for a step without them (untimed, or no T
    blocks streamed)."""
    keys = ("dev_first_copy_s", "dev_last_copy_s", "dev_end_s", "pcie_s")
    if any(timing.get(k) is None for k in keys):
        return None
    first, last, end, busy = (1e3 * float(timing[k]) for k in keys)
    return {"busy_ms": busy, "before_ms": first, "between_ms": max(0.0, last - first - busy),
            "after_ms": max(0.0, end - last), "device_step_ms": end,
            "host_outside_ms": max(0.0, 1e3 * wall_s - end),
            "link_gb": float(timing.get("pcie_bytes") or 0.0) / 1e9,
            "busy_gbps": (float(timing.get("pcie_bytes") or 0.0) / busy / 1e6 if busy > 0
                          else float("nan"))}


def median_split(splits: list[dict]) -> dict:
    """Each figure's median over the steps (the upper one of an even count)."""
    return {k: sorted(s[k] for s in splits)[len(splits) // 2] for k in splits[0]}


def print_link(s: dict) -> None:
    print(f"\nlink (timed steps' median): busy {s['busy_ms']:.1f} ms ({s['link_gb']:.2f} GB at "
          f"{s['busy_gbps']:.1f} GB/s) of the device's {s['device_step_ms']:.1f} ms step; idle "
          f"before its first copy {s['before_ms']:.1f} ms, between copies {s['between_ms']:.1f} "
          f"ms, after its last {s['after_ms']:.1f} ms; host outside the device's step "
          f"{s['host_outside_ms']:.1f} ms")
