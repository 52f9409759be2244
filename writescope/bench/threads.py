"""Per-thread CPU time of this process over a stretch of work (Linux ``/proc``).

The CPU experts' kernel and the CPU attention kernel run as teams whose every member must
finish before the call does: one member on a core shared with a busy thread stalls the call
(``attention/hostflag.py``). On the H200 host, rows that did the same work had their CPU experts
take either ~155 or ~250 ms a step, one or the other for a whole row (2026-12-01h-h200 call 1).
A slow host and a spinning thread of our own look alike in step times; which threads burnt how
much CPU during the decode steps tells them apart. A row records :func:`busy_threads` between
two :func:`snapshot` calls taken around its timed steps, with each thread's context switches
(voluntary: it waited; involuntary: it was preempted, its core wanted elsewhere), and
:func:`python_probe_us` before and after them: the same pure-Python loop's time says whether
the launching thread ran at its usual speed (a slow core, or a sibling hyperthread busy under
the VM, slows it without any thread of ours being busy).
"""
from __future__ import annotations

import os
import threading

#: the kernel's clock ticks per second (utime/stime in /proc/<pid>/task/<tid>/stat)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def python_probe_us(reps: int = 5, n: int = 20000) -> float:
    """Median microseconds of a fixed pure-Python loop on the calling thread."""
    import time
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        acc = 0
        for i in range(n):
            acc += i & 7
        ts.append(time.perf_counter() - t)
    return round(sorted(ts)[len(ts) // 2] * 1e6, 1)


def _switches(base: str, tid: str) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of one thread so far; (0, 0) if unreadable."""
    v = iv = 0
    try:
        with open(f"{base}/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    v = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    iv = int(line.split()[1])
    except OSError:
        pass
    return v, iv


def snapshot() -> dict[int, tuple[str, float, int, int, int]]:
    """``{tid: (name, CPU seconds so far, CPU it last ran on, voluntary and involuntary context
    switches so far)}`` for every thread of this process; ``{}`` where there is no ``/proc``
    (not Linux). A Python thread is named by its ``threading`` name, others by the kernel's
    (OpenMP and driver threads)."""
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
        out[tid] = (names.get(tid, comm), cpu_s, int(rest[36]), *_switches(base, t))
    return out


def busy_threads(before: dict, after: dict, wall_s: float, top: int = 24) -> dict | None:
    """What the threads did between two snapshots ``wall_s`` seconds apart: the process's CPU
    seconds, how many threads were busy more than half the time, and the ``top`` busiest
    (name, CPU seconds, fraction of the wall time, the CPU each last ran on). None without
    snapshots."""
    if not before or not after or wall_s <= 0:
        return None
    rows = []
    for tid, (name, cpu_s, core, *sw) in after.items():
        b = before.get(tid)
        d = cpu_s - (b[1] if b else 0.0)
        row = {"tid": tid, "name": name, "cpu_s": round(d, 3), "frac": round(d / wall_s, 3),
               "cpu": core}
        if len(sw) == 2:
            b_sw = b[3:5] if b and len(b) >= 5 else (0, 0)
            row["vcsw"], row["ivcsw"] = sw[0] - b_sw[0], sw[1] - b_sw[1]
        rows.append(row)
    rows.sort(key=lambda r: -r["cpu_s"])
    return {"wall_s": round(wall_s, 4), "process_cpu_s": round(sum(r["cpu_s"] for r in rows), 3),
            "threads": len(rows), "busy_over_half": sum(r["frac"] > 0.5 for r in rows),
            "top": rows[:top]}
