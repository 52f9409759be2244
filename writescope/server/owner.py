"""The engine's own thread: it builds the engine, then steps it, so that every torch op the
engine runs has one OpenMP thread team behind it.

libgomp (torch's OpenMP runtime on Linux) gives each thread that starts parallel work a team of
its own, kept for the thread's life. Once the teams together hold more threads than there are
cores, it makes every idle team member sleep after ~100 spins instead of ~300,000, so each
parallel op waits for its members to be woken. A server that built the engine on its main
thread (whose team the model's loading made) and stepped it on another was in that state: on
the 2-core dev VM its CPU decode steps took 43 ms against 30 on the building thread, with 264
voluntary context switches a step against none (``bench/results/2026-12-04c-devbox/
omp_teams.py``). :class:`EngineThread` is that one thread.
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable

_CLOSE = object()


class EngineThread:
    """A single long-lived worker thread: :meth:`call` runs a function on it and returns its
    result (or raises its exception); :meth:`submit` returns a future instead. Jobs run one at a
    time, in order. :meth:`close` ends the thread once the jobs before it are done."""

    def __init__(self, name: str = "writescope-engine") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _CLOSE:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 -- the caller gets it through the future
                fut.set_exception(e)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any
               ) -> concurrent.futures.Future:
        if not self._thread.is_alive():
            raise RuntimeError("the engine thread has ended")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fut, fn, args, kwargs))
        return fut

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.submit(fn, *args, **kwargs).result()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        self._jobs.put(_CLOSE)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)
