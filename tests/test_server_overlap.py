"""`writescope serve` with overlapped decode steps (engine/inflight.py; on by default on CUDA,
``WRITESCOPE_ASYNC_DECODE=1`` here on the CPU): test_server's 32 concurrent streams, every third
one hung up mid-stream, against the in-process reference LLM, which does not overlap. Every
client that stays gets exactly the reference's text, nothing runs or waits afterwards, no KV
block is held, and the server's metrics show that its steps did overlap."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("openai")

import test_server as ts  # noqa: E402
from test_server import client, llm, url  # noqa: E402,F401 - module fixtures, over this server
from writescope.bench.serve import LaunchedServer  # noqa: E402


@pytest.fixture(scope="module")
def server():
    from writescope.models.config import ModelConfig
    from writescope.models.default import default_model_path
    from writescope.planner.profile import load_or_default
    load_or_default(model_config=ModelConfig.from_hf(default_model_path()))
    env = dict(os.environ, OMP_NUM_THREADS="1", WRITESCOPE_ASYNC_DECODE="1")
    srv = LaunchedServer(ts.SERVER_ARGS, env=env)
    try:
        yield srv
    finally:
        srv.stop(60)


def test_overlapped_streams_with_disconnects(client, llm, url):  # noqa: F811
    ts.test_32_concurrent_streams_with_disconnects(client, llm, url)
    m = ts._metrics(url)
    overlapped = [v for k, v in m.items() if k.endswith("overlapped_steps")]
    assert overlapped and overlapped[0] > 0, sorted(k for k in m if "engine_" in k)[:40]
