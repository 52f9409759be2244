"""The engine loop: the one thread that calls the engine (it is not thread-safe), and the
bridge between it and the asyncio event loop that serves HTTP (server/api.py).

HTTP handlers talk to the engine only through a thread-safe command queue (add, abort, stop).
The engine thread steps while any request is unfinished and blocks on the queue when there is
none (no busy wait). Between two steps it applies every queued command, so requests join and
leave the running batch at step boundaries (continuous batching). Each step's outputs go back to
the event loop in one ``call_soon_threadsafe`` per step, as :class:`Delta` s (new token ids and
log-probabilities, plus the engine's full text so far), onto per-HTTP-request asyncio queues.
``writescope serve`` builds the engine on this same thread (server/owner.py says why).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from ..core import SamplingParams
from . import protocol as P
from .metrics import ServerMetrics

log = logging.getLogger("writescope.server")


@dataclass
class Delta:
    """What one engine step produced for one request (sent to the event loop)."""

    new_token_ids: list[int]
    new_logprobs: list[float] | None
    new_top_logprobs: list[dict[int, float]] | None  # the alternatives asked for, per new token
    text: str | None           # the engine's full detokenised text so far (None: unchanged)
    finish_reason: str | None
    #: (prompt log-probabilities, their alternatives or None, their ranks), with the first
    #: tokens only
    prompt: tuple | None = None
    #: prompt tokens found in the prefix cache
    cached_tokens: int = 0
    #: the stop string or stop token id that ended it (with ``finish_reason``)
    stop_reason: int | str | None = None


class EngineFailure(Exception):
    """The engine raised while stepping; every request in flight fails with it."""


@dataclass
class _Sink:
    queue: asyncio.Queue
    tag: Any
    arrival: float
    n_tokens: int = 0
    n_logprobs: int = 0
    n_top_logprobs: int = 0
    sent_prompt: bool = False
    first_token_time: float | None = None
    last_token_time: float | None = None
    queue_observed: bool = False


_STOP = object()


class EngineLoop:
    """Owns the engine: one thread steps it; everything else sends commands through a queue."""

    def __init__(self, engine: Any, metrics: ServerMetrics, stats_interval_s: float = 0.05,
                 engine_thread: Any = None) -> None:
        self.engine = engine
        #: the thread that built the engine (``server/owner.py``), to step it on; None: a new one
        self.engine_thread = engine_thread
        self.metrics = metrics
        self.stats_interval_s = stats_interval_s
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._last_stats = 0.0
        self.dead: BaseException | None = None  # set when the engine can no longer be trusted
        self.stopping = False

    # -- event-loop side ----------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._publish_stats()
        if self.engine_thread is not None:  # the thread that built it steps it
            self._thread = self.engine_thread
            self._thread.submit(self._run)
            self._thread.close()  # (it ends when the loop does)
            return
        self._thread = threading.Thread(target=self._run, name="writescope-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    def add(self, request_id: str, prompt: list[int], params: SamplingParams,
            out: asyncio.Queue, tag: Any, arrival: float,
            cache_salt: str | None = None, priority: int = 0) -> asyncio.Future:
        """Queue a request; the future resolves to None once admitted or raises why not.
        ``cache_salt``: vLLM's (its prompt blocks shared only with the same salt);
        ``priority``: vLLM's (``LLMEngine.add_request``)."""
        return self.add_all([(request_id, prompt, params, tag)], out, arrival, cache_salt,
                            priority)

    def add_all(self, requests: list[tuple[str, list[int], SamplingParams, Any]],
                out: asyncio.Queue, arrival: float,
                cache_salt: str | None = None, priority: int = 0) -> asyncio.Future:
        """Queue requests ``(request_id, prompt, params, tag)``, all of ``priority``, admitted
        all or none, between
        two steps: the future resolves to None once all are, or raises why one was not (those
        added before it are taken back at once, never stepped, and counted nowhere: a refused
        HTTP request counts only as refused)."""
        assert self._loop is not None, "engine loop not started"
        fut = self._loop.create_future()
        if self.stopping or not self.alive:
            fut.set_exception(P.APIError("the server is shutting down" if self.stopping
                                         else "the engine is not running", status=503,
                                         type="server_error", code="unavailable"))
            return fut
        self._cmds.put(("add", list(requests), out, arrival, cache_salt, priority, fut))
        return fut

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    def cancel_all(self) -> None:
        """Abort every running or waiting request; each ends with finish_reason "abort"."""
        self._cmds.put(("cancel_all",))

    def reset_prefix_cache(self) -> asyncio.Future:
        """Forget the engine's cached prompt blocks, on its thread; the future resolves to
        whether it did (only while no request is running or waiting)."""
        assert self._loop is not None, "engine loop not started"
        fut = self._loop.create_future()
        if self.stopping or not self.alive:
            fut.set_result(False)
        else:
            self._cmds.put(("reset_prefix_cache", fut))
        return fut

    def stop(self, timeout: float = 30.0) -> None:
        """Abort what is left, end the thread (called at lifespan shutdown)."""
        self.stopping = True
        if self._thread is None:
            return
        self._cmds.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("engine thread did not stop within %.0f s", timeout)

    # -- engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop_forever()
        except BaseException as e:  # noqa: BLE001 -- a bug here must not leave clients hanging
            log.critical("the engine loop crashed:\n%s", traceback.format_exc())
            self.dead = e
            self._fail_all(EngineFailure(f"engine loop crashed: {type(e).__name__}: {e}"))
            self._refuse_queued(P.APIError("the engine is not running", status=503,
                                           type="server_error", code="unavailable"))

    def _loop_forever(self) -> None:
        eng = self.engine
        while True:
            idle = not eng.has_unfinished_requests()
            if idle:
                self._publish_stats()
            try:
                while True:  # apply every queued command; wait for one only when idle
                    cmd = self._cmds.get(block=idle)
                    idle = False
                    if cmd is _STOP:
                        self._shutdown()
                        return
                    self._apply(cmd)
            except queue.Empty:
                pass
            if eng.has_unfinished_requests():
                self._step()

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, requests, out, arrival, salt, priority, fut = cmd
            added: list[str] = []
            try:
                for rid, prompt, params, _ in requests:
                    self.engine.add_request(rid, prompt if salt is None else
                                            {"prompt_token_ids": prompt, "cache_salt": salt},
                                            params, priority=priority)
                    added.append(rid)
            except BaseException as e:  # noqa: BLE001 -- handed to the waiting handler
                for rid in added:  # all or none: before any step, so nothing of them ran
                    try:
                        self.engine.abort_request(rid)
                    except Exception as e2:  # noqa: BLE001
                        log.error("abort of %s failed: %s", rid, e2)
                        self.dead = e2
                self._resolve(fut, e)
                return
            for rid, prompt, _, tag in requests:
                self._sinks[rid] = _Sink(out, tag, arrival)
                self.metrics.prompt_tokens.inc(len(prompt))
            self._resolve(fut, None)
        elif cmd[0] == "cancel_all":
            deliveries = []
            for rid, sink in list(self._sinks.items()):
                self._apply(("abort", rid))
                deliveries.append((sink.queue, sink.tag, Delta([], None, None, None, "abort")))
            if deliveries:
                self._call(_deliver, deliveries)
        elif cmd[0] == "reset_prefix_cache":
            try:
                done = bool(self.engine.reset_prefix_cache())
            except Exception as e:  # noqa: BLE001 -- answered as not done
                log.error("reset_prefix_cache failed: %s", e)
                done = False
            self._call(_set_value, cmd[1], done)
        elif cmd[0] == "abort":
            rid = cmd[1]
            sink = self._sinks.pop(rid, None)
            try:
                self.engine.abort_request(rid)
            except Exception as e:  # noqa: BLE001
                log.error("abort of %s failed: %s", rid, e)
                self.dead = e
            if sink is not None:
                self.metrics.requests_total.inc(labels={"finished_reason": "abort"})

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outs = self.engine.step()
        except Exception as e:  # noqa: BLE001
            log.error("engine step failed:\n%s", traceback.format_exc())
            self.metrics.engine_errors.inc()
            self._fail_all(EngineFailure(f"engine error: {type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        now = time.monotonic()
        deliveries: list[tuple[asyncio.Queue, Any, Delta]] = []
        new_total = 0
        for out in outs:
            sink = self._sinks.get(out.request_id)
            if sink is None:
                continue  # aborted since it was scheduled
            ids = out.token_ids
            n = len(ids)
            new_ids = list(ids[sink.n_tokens:n])
            new_lp = None
            if out.logprobs is not None:
                new_lp = list(out.logprobs[sink.n_logprobs:])
                sink.n_logprobs = len(out.logprobs)
            new_top = None
            if out.top_logprobs is not None:
                new_top = list(out.top_logprobs[sink.n_top_logprobs:])
                sink.n_top_logprobs = len(out.top_logprobs)
            prompt = None
            if out.prompt_token_logprobs is not None and not sink.sent_prompt:
                # complete: prefilled
                prompt = (out.prompt_token_logprobs, out.prompt_top_logprobs, out.prompt_ranks)
                sink.sent_prompt = True
            if out.queue_time_s is not None and not sink.queue_observed:
                sink.queue_observed = True
                self.metrics.queue_time.observe(out.queue_time_s)
            if new_ids:
                new_total += len(new_ids)
                if sink.first_token_time is None:
                    sink.first_token_time = now
                    self.metrics.ttft.observe(now - sink.arrival)
                else:  # the gap since its last tokens (vLLM's inter-token latency)
                    self.metrics.itl.observe(now - sink.last_token_time)
                sink.last_token_time = now
            sink.n_tokens = n
            deliveries.append((sink.queue, sink.tag,
                               Delta(new_ids, new_lp, new_top, out.text, out.finish_reason,
                                     prompt, out.num_cached_tokens, out.stop_reason)))
            if out.finish_reason is not None:
                del self._sinks[out.request_id]
                self.metrics.requests_total.inc(labels={"finished_reason": str(out.finish_reason)})
                self.metrics.e2e.observe(now - sink.arrival)
                if n > 1 and sink.first_token_time is not None:
                    self.metrics.tpot.observe((now - sink.first_token_time) / (n - 1))
        self.metrics.record_step(dt, new_total, now)
        if deliveries:
            self._call(_deliver, deliveries)
        if time.monotonic() - self._last_stats >= self.stats_interval_s:
            self._publish_stats()

    def _fail_all(self, err: Exception) -> None:
        deliveries = [(s.queue, s.tag, err) for s in self._sinks.values()]
        if self._sinks:  # each request in flight ends with the step (vLLM's "error")
            self.metrics.requests_total.inc(len(self._sinks), labels={"finished_reason": "error"})
        for rid in list(self._sinks):
            try:
                self.engine.abort_request(rid)
            except Exception as e:  # noqa: BLE001
                log.error("abort after a failed step raised too; engine marked dead: %s", e)
                self.dead = e
        self._sinks.clear()
        if deliveries:
            self._call(_deliver, deliveries)
        self._publish_stats()

    def _shutdown(self) -> None:
        gone = P.APIError("the server is shutting down", status=503, type="server_error",
                          code="unavailable")
        deliveries = []
        for rid, s in list(self._sinks.items()):
            try:
                self.engine.abort_request(rid)
            except Exception as e:  # noqa: BLE001
                log.error("abort of %s at shutdown failed: %s", rid, e)
            deliveries.append((s.queue, s.tag, Delta([], None, None, None, "abort")))
        self._sinks.clear()
        self._refuse_queued(gone)  # commands that raced the stop
        if deliveries:
            self._call(_deliver, deliveries)
        self._publish_stats()

    def _refuse_queued(self, err: Exception) -> None:
        """Answer every queued request that was never added with ``err`` (a queued reset of the
        prefix cache: not done)."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break
            if cmd is not _STOP and cmd[0] == "add":
                self._resolve(cmd[-1], err)
            elif cmd is not _STOP and cmd[0] == "reset_prefix_cache":
                self._call(_set_value, cmd[1], False)

    def _publish_stats(self) -> None:
        self._last_stats = time.monotonic()
        eng = self.engine
        try:
            stats = eng.stats()
        except Exception as e:  # noqa: BLE001 -- metrics must never take the loop down
            log.warning("engine.stats() failed: %s", e)
            stats = {}
        self.metrics.record_engine_stats(stats, int(getattr(eng, "num_running", 0)),
                                         int(getattr(eng, "num_waiting", 0)))

    def _resolve(self, fut: asyncio.Future, exc: BaseException | None) -> None:
        self._call(_set_future, fut, exc)

    def _call(self, fn: Callable, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


def _deliver(deliveries: list) -> None:
    for q, tag, item in deliveries:
        q.put_nowait((tag, item))


def _set_value(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_future(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
