"""``writescope calibrate [--quick] [--out profile.json] [--model M ...] [--threads N]``

Measures this machine's ceilings (see :mod:`writescope.planner.profile`) and saves them as a
versioned JSON profile. Without ``--out`` it writes this machine's profile cache, which the
engine reads at start-up.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this machine's bandwidths and kernel rates",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller probes (seconds, less exact)")
    p.add_argument("--out", metavar="PATH", help="profile JSON to write (default: this machine's cache)")
    p.add_argument("--model", action="append", metavar="PATH|NAME",
                   help="time this model's attention family and expert shape (a folder, a "
                        "reference name or writescope-default; repeatable; default: the three "
                        "reference models)")
    p.add_argument("--threads", type=int,
                   help="torch CPU threads for the probes (default: torch's, this machine's cores)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..planner.calibrate import calibrate
    from ..planner.profile import default_cache_path
    from .common import check_writable
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    out = args.out or default_cache_path()
    # a path that cannot be written fails now, not after minutes of probes
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a folder; give the profile JSON's file name")
    check_writable("--out", out, Path(out).parent, make=True)
    cmd = "writescope " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    from ..engine.model_source import config_source
    models = [config_source(m) for m in args.model] if args.model else None
    prof = calibrate(quick=args.quick, models=models, threads=args.threads, command=cmd)
    prof.save(out)
    print(f"profile written to {out}")
    return 0
