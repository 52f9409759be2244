"""Runs a snippet in a fresh interpreter with Triton's CPU interpreter on (TRITON_INTERPRET must
be set before Triton is imported, so never in the test process itself)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_interpreted(code: str, *args: str, env: dict | None = None, timeout: int = 600
                    ) -> subprocess.CompletedProcess:
    """``python -c code *args`` from the repository root with the package on the path,
    TRITON_INTERPRET=1 and ``env`` added."""
    full = dict(os.environ, TRITON_INTERPRET="1",
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], env=full, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def interpreted_json(code: str, *args: str, env: dict | None = None) -> dict:
    """:func:`run_interpreted` for a snippet whose last line of output is JSON, with the decode
    kernels' data-bounded loops: skips the test where Triton or such loops are not to be had
    here, fails it where the snippet fails, and returns the JSON."""
    import json

    import pytest
    pytest.importorskip("triton")
    from test_hybrid import interpreter_runs_loaded_loops
    why = interpreter_runs_loaded_loops()
    if why is not None:
        pytest.skip(f"Triton's interpreter cannot run data-bounded loops here: {why}")
    r = run_interpreted(code, *args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
