"""Where a benchmark result came from: the git commit, whether the tree was dirty, and a digest
of the package's own sources.

The digest is what identifies the code that ran when git cannot: the device machine receives a
copy of the working tree whose ``.git`` may point at an older commit (the H200 runs of 2026-11-30
recorded a stale HEAD). ``python -m writescope.bench.provenance`` prints the digest of this tree,
so a result can be matched to the commit whose digest is the same. ``WRITESCOPE_GIT_COMMIT``
overrides the commit for copies without git history.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parent
_SUFFIXES = (".py", ".cpp", ".h", ".json")


def source_digest(root: Path = PACKAGE) -> str:
    """sha256 (16 hex digits) over the package's source files: relative path and bytes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def result_header(bench: str, argv: list[str] | None = None) -> dict[str, Any]:
    """The fields every benchmark's JSON starts with: its name, the commit, the source digest and
    the command line (``argv``, default ``sys.argv[1:]``) that reproduces it."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    return {"bench": bench, "git_commit": git_commit(), "source_digest": source_digest(),
            "command": f"python -m writescope.bench.{bench} " + " ".join(args)}


def write_json(path: str | os.PathLike, result: dict[str, Any]) -> None:
    """Write a benchmark's result (creating the folder)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


def git_commit() -> str | None:
    env = os.environ.get("WRITESCOPE_GIT_COMMIT")
    if env:
        return env
    out = _git("rev-parse", "HEAD")
    return out if out and len(out) == 40 else None


def git_info() -> dict[str, Any]:
    """``{"commit", "dirty", "source_digest"}`` (commit/dirty None without git)."""
    status = _git("status", "--porcelain")
    return {"commit": git_commit(), "dirty": None if status is None else bool(status),
            "source_digest": source_digest()}


if __name__ == "__main__":
    info = git_info()
    print(f"source digest {info['source_digest']}  commit {info['commit']}"
          + ("  (uncommitted changes)" if info["dirty"] else ""))
