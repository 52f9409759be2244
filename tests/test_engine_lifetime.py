"""An engine and everything it allocated go with its last reference. The engine freezes the
objects alive at start-up out of the garbage collector's reach (``engine.freeze_gc``), so a
reference cycle through it would keep it -- its KV pools, staging buffers and weights -- for
the life of the process: a second ``LLM`` in one process then ran out of GPU memory (the
sixty-third session's GPU suite: 14 tests out of memory after 36 engines with the experts on the
CPU, whose runner held a bound method of the engine)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from test_parity import PLACEMENTS, engine, prompt_ids
from writescope import SamplingParams

CONFIGS = {
    "experts-gpu": dict(experts="gpu", **PLACEMENTS["all-G"]),
    "experts-cpu": dict(experts="cpu", **PLACEMENTS["all-G"]),
    "experts-cpu-mixed": dict(experts="cpu", **PLACEMENTS["mixed"]),
    "writescope": dict(kv_policy="writescope", num_gpu_blocks=2),
    "migrate": dict(kv_policy="migrate", num_gpu_blocks=2),
    "prefix-cache": dict(enable_prefix_caching=True, **PLACEMENTS["all-G"]),
}


def _gone_after_use(path, opts: dict, overlap: str, monkeypatch) -> weakref.ref:
    monkeypatch.setenv("WRITESCOPE_ASYNC_DECODE", overlap)
    llm = engine(path, **opts)
    llm.generate([prompt_ids(320, 40, seed=3), prompt_ids(320, 9, seed=4)],
                 SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    ref = weakref.ref(llm.engine)
    del llm
    gc.collect()  # (frozen objects are out of its reach: only a cycle-free engine goes)
    return ref


@pytest.mark.parametrize("config", list(CONFIGS))
def test_an_engine_goes_with_its_last_reference(tiny_qwen3_moe, config, monkeypatch):
    ref = _gone_after_use(tiny_qwen3_moe, CONFIGS[config], "1", monkeypatch)
    assert ref() is None, f"{config}: the engine outlived its last reference"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", ["experts-gpu", "experts-cpu", "experts-cpu-mixed"])
def test_an_engine_gives_its_gpu_memory_back(all_tiny, config, monkeypatch):
    """On CUDA (CUDA graphs, resident and overlapped steps, graphed CPU expert calls): the
    engine goes, and the device memory allocated is what it was before it -- after a first
    engine, which may leave what the process keeps once (cuBLAS's workspace of each stream it
    ran on: the captures' warm-up stream is one per device, ``graphs._warmup_stream``; until
    the sixty-third session each capture made a stream of its own, and each engine left 64-96
    MiB behind)."""
    opts = dict(CONFIGS[config], device="cuda")
    _gone_after_use(all_tiny, opts, "auto", monkeypatch)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    ref = _gone_after_use(all_tiny, opts, "auto", monkeypatch)
    assert ref() is None, f"{config}: the engine outlived its last reference"
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 16 << 20
