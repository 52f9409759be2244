"""``python -m writescope.bench.hostflag [--json FILE]``: does the device wait for a host flag, and
how late does it wake up? For each wait mode of :mod:`writescope.attention.hostflag`:

* ordering: a kernel queued behind a wait must not have run while the flag is low (checked after
  the host has slept), and must run once the host raises it;
* wake-up: host time from raising the flag to the stream being done (median of ``--reps``);
* time-out (spinning modes): a wait that is never signalled gives up and is reported.

Prints one line per mode and exits non-zero when no mode works.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..attention.hostflag import READ_MODES, HostFlags


def probe(mode: str, reps: int) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    f = HostFlags(4, dev, max_spins=200_000, read=mode)
    x = torch.zeros(1 << 16, device=dev)
    wake, ordered = [], True
    for r in range(1, reps + 1):
        f.wait(2, r)
        x.fill_(float(r))
        done = torch.cuda.Event()
        done.record()
        time.sleep(0.005)
        ordered &= not done.query()  # still held by the wait
        t0 = time.perf_counter()
        f.signal(2, r)
        done.synchronize()
        wake.append(time.perf_counter() - t0)
    ordered &= float(x[0]) == float(reps)
    f.check()
    timeout_ok = None
    if mode != "memop":
        f.wait(3, 1)
        torch.cuda.synchronize()
        try:
            f.check()
            timeout_ok = False
        except RuntimeError:
            timeout_ok = True
    return {"mode": mode, "ordered": bool(ordered), "wake_us_p50": statistics.median(wake) * 1e6,
            "wake_us_max": max(wake) * 1e6, "timeout_reported": timeout_ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    rows = []
    for mode in READ_MODES:
        try:
            row = probe(mode, args.reps)
        except Exception as e:  # noqa: BLE001 - a mode this machine cannot run is a result
            row = {"mode": mode, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)
    ok = [r for r in rows if r.get("ordered")]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
