"""Per-thread CPU time of this process over a stretch of work (Linux ``/proc``).

The CPU experts' kernel and the CPU attention kernel run as teams whose every member must
finish before the call does: one member on a core shared with a busy thread stalls the call
(``attention/hostflag.py``). On the H200 host, rows that did the same work had their CPU experts
take either ~155 or ~250 ms a step, one or the other for a whole row (2026-12-01h-h200 call 1).
A slow host and a spinning thread of our own look alike in step times; which threads burnt how
much CPU during the decode steps tells them apart. A row records :func:`busy_threads` between
two :func:`snapshot` calls taken around its timed steps.
"""
from __future__ import annotations

import os
import threading

#: the kernel's clock ticks per second (utime/stime in /proc/<pid>/task/<tid>/stat)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def snapshot() -> dict[int, tuple[str, float, int]]:
    """``{tid: (name, CPU seconds so far, CPU it last ran on)}`` for every thread of this
    process; ``{}`` where there is no ``/proc`` (not Linux). A Python thread is named by its
    ``threading`` name, others by the kernel's (OpenMP and driver threads)."""
    base = f"/proc/{os.getpid()}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return {}
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for t in tids:
        try:
            with open(f"{base}/{t}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        # "tid (comm) state ppid ...": comm may hold spaces and parentheses
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        # fields after comm start at field 3 (state): utime is field 14, stime 15, processor 39
        cpu_s = (int(rest[11]) + int(rest[12])) / _TICK
        tid = int(t)
        out[tid] = (names.get(tid, comm), cpu_s, int(rest[36]))
    return out


def busy_threads(before: dict, after: dict, wall_s: float, top: int = 24) -> dict | None:
    """What the threads did between two snapshots ``wall_s`` seconds apart: the process's CPU
    seconds, how many threads were busy more than half the time, and the ``top`` busiest
    (name, CPU seconds, fraction of the wall time, the CPU each last ran on). None without
    snapshots."""
    if not before or not after or wall_s <= 0:
        return None
    rows = []
    for tid, (name, cpu_s, core) in after.items():
        d = cpu_s - (before[tid][1] if tid in before else 0.0)
        rows.append({"tid": tid, "name": name, "cpu_s": round(d, 3),
                     "frac": round(d / wall_s, 3), "cpu": core})
    rows.sort(key=lambda r: -r["cpu_s"])
    return {"wall_s": round(wall_s, 4), "process_cpu_s": round(sum(r["cpu_s"] for r in rows), 3),
            "threads": len(rows), "busy_over_half": sum(r["frac"] > 0.5 for r in rows),
            "top": rows[:top]}
