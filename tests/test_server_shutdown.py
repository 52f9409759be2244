"""`writescope serve` stopped by Ctrl-C twice (the second skips the grace period) while a stream
runs: the running request is cancelled, the app's lifespan shutdown still runs (the engine loop
stops; no CancelledError traceback from an abandoned lifespan task), and the exit status is
Ctrl-C's 130."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from writescope.bench.serve import LaunchedServer  # noqa: E402


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_second_ctrl_c_still_shuts_the_app_down(sigint):
    """Also with SIGINT ignored when the server starts (a shell's background job: uvicorn still
    handles it, but its re-raise of it after the shutdown was ignored and the exit status 0)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    srv = LaunchedServer(["--dtype", "float32", "--device", "cpu", "--max-model-len", "1024",
                          "--shutdown-timeout", "30", "--log-level", "info"], env=env,
                         preexec_fn=_ignore_sigint if sigint == "ignored" else None)
    try:
        url = srv.wait_ready(300)
        streaming = threading.Event()

        def stream():
            body = {"model": "writescope-default", "prompt": "Once", "max_tokens": 900,
                    "ignore_eos": True, "stream": True}
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                            streaming.set()
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert streaming.wait(60)
        srv.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        srv.proc.send_signal(signal.SIGINT)  # before the 30 s grace ends: force
        rc = srv.proc.wait(60)
        assert rc == 130, srv.output()[-3000:]
        t.join(30)
        out = srv.output()
        assert "Traceback" not in out and "CancelledError" not in out, out[-3000:]
        assert "Application shutdown complete" in out and "interrupted" in out
    finally:
        srv.stop(30)
