"""Serving metrics in the Prometheus text exposition format (version 0.0.4).

A deliberately small registry -- counters, gauges and histograms, optionally labelled -- written
for one process whose engine thread records and whose HTTP thread renders: every metric takes the
registry's lock, so a scrape sees a consistent snapshot. The format follows
https://prometheus.io/docs/instrumenting/exposition_formats/ (``# HELP``/``# TYPE`` lines,
cumulative ``_bucket{le=...}`` series ending in ``+Inf``, then ``_sum`` and ``_count``); the
metric names follow vLLM's ``vllm:time_to_first_token_seconds`` family under a ``writescope_``
prefix, every series carries vLLM's ``model_name`` label (the served model's first name), and
the histograms have every bucket edge of vLLM's. Not vLLM's: ``time_per_output_token_seconds``
observes each request's mean time per token after the first (vLLM's
``request_time_per_output_token``); each gap between tokens is in
``inter_token_latency_seconds``, and each request's wait for admission into the running batch
in ``request_queue_time_seconds``, as vLLM's; ``num_preemptions_total`` follows the engine's
``engine.preemptions`` (``scheduling_policy="priority"``). A request whose engine step failed
counts as finished with reason ``error`` (vLLM's).

:class:`ServerMetrics` holds the serving metrics proper (requests, tokens, latencies) and turns
the engine's flat ``stats()`` dict into gauges (KV blocks per region, the planner's CPU share and
prediction error, and every other numeric stat under ``writescope_engine_*``).
"""
from __future__ import annotations

import bisect
import math
import re
import threading
import time
from collections import deque
from typing import Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")


def sanitize_name(name: str) -> str:
    """A legal metric name from any string (``kv.blocks.G`` -> ``kv_blocks_G``)."""
    out = _NAME_BAD.sub("_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def _fmt(v: float) -> str:
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _q(value: str) -> str:
    return '"' + _escape(value) + '"'


def _labels(names: tuple[str, ...], values: tuple[str, ...], *extra: str) -> str:
    """``{a="x",...}``: the ``extra`` label texts (the registry's constant labels first, a
    bucket's ``le``) around the metric's own."""
    parts = [e for e in extra[:1] if e]
    parts += [f"{n}={_q(v)}" for n, v in zip(names, values)]
    parts += [e for e in extra[1:] if e]
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, registry: "Registry", name: str, help: str, labelnames: Iterable[str] = ()):
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = registry.lock
        registry.register(self)

    def _key(self, labels: dict[str, str] | None) -> tuple[str, ...]:
        labels = labels or {}
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def render(self, const: str = "") -> list[str]:
        """The metric's lines; ``const``: labels every series carries (``model_name="m"``)."""
        raise NotImplementedError

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._values: dict[tuple[str, ...], float] = {}
        if not self.labelnames:
            self._values[()] = 0

    def inc(self, amount: float = 1, labels: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def value(self, labels: dict[str, str] | None = None) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0)

    def render(self, const: str = "") -> list[str]:
        lines = self.header()
        for key, v in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(self.labelnames, key, const)} {_fmt(v)}")
        return lines


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._values: dict[tuple[str, ...], float] = {}
        if not self.labelnames:
            self._values[()] = 0

    def set(self, value: float, labels: dict[str, str] | None = None) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value

    def value(self, labels: dict[str, str] | None = None) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0)

    def render(self, const: str = "") -> list[str]:
        lines = self.header()
        for key, v in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(self.labelnames, key, const)} {_fmt(v)}")
        return lines


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, registry: "Registry", name: str, help: str, buckets: Iterable[float]):
        super().__init__(registry, name, help)
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self._counts = [0] * (len(self.buckets) + 1)  # last: above every edge (+Inf only)
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)  # first edge >= value: le is inclusive
        with self._lock:
            self._counts[i] += 1
            self._sum += value
            self._count += 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def render(self, const: str = "") -> list[str]:
        lines = self.header()
        acc = 0
        for edge, c in zip(self.buckets, self._counts):
            acc += c
            le = _labels((), (), const, "le=" + _q(_fmt(edge)))
            lines.append(f"{self.name}_bucket{le} {acc}")
        le = _labels((), (), const, "le=" + _q("+Inf"))
        lines.append(f"{self.name}_bucket{le} {self._count}")
        lines.append(f"{self.name}_sum{_labels((), (), const)} {_fmt(self._sum)}")
        lines.append(f"{self.name}_count{_labels((), (), const)} {self._count}")
        return lines


class Registry:
    """The metrics of one process; ``const_labels`` every series carries (vLLM's
    ``model_name``)."""

    def __init__(self, const_labels: dict[str, str] | None = None) -> None:
        self.lock = threading.RLock()
        self._metrics: dict[str, _Metric] = {}
        self.const = ",".join(f"{k}={_q(v)}" for k, v in (const_labels or {}).items())

    def register(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric

    def get(self, name: str) -> _Metric | None:
        return self._metrics.get(name)

    def render(self) -> str:
        with self.lock:
            lines: list[str] = []
            for m in self._metrics.values():
                lines.extend(m.render(self.const))
        return "\n".join(lines) + "\n"


# Bucket edges (seconds): every edge of vLLM's (a query or alert that reads one of its buckets
# finds it here), plus finer ones below 10 ms a token and 300 ms a request for small, fast
# models. TTFT spans queueing behind long prefills, TPOT one step.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

PREFIX = "writescope_"
#: engine stats with a dedicated metric name; everything else goes to writescope_engine_<key>
_KV_BLOCKS = re.compile(r"^kv\.blocks\.([A-Za-z0-9_]+)$")
_PLANNER_NAMES = {
    "planner.cpu_share": ("planner_cpu_share",
                          "Share of spilled KV the planner assigns to the CPU (0..1)"),
    "planner.prediction_error": ("planner_prediction_error",
                                 "Relative error of the planner's last step-time prediction"),
}


class ServerMetrics:
    """Everything ``GET /metrics`` shows. Thread-safe; the engine loop records, HTTP renders."""

    def __init__(self, model_name: str, throughput_window_s: float = 10.0) -> None:
        r = self.registry = Registry({"model_name": model_name})
        p = PREFIX
        self.requests_running = Gauge(r, p + "num_requests_running",
                                      "Requests in the running batch")
        self.requests_waiting = Gauge(r, p + "num_requests_waiting",
                                      "Requests admitted and waiting for KV room or a batch slot")
        self.requests_total = Counter(r, p + "request_success_total",
                                      "Finished requests by finish reason", ["finished_reason"])
        self.requests_rejected = Counter(r, p + "request_rejected_total",
                                         "Requests refused with a 4xx status", ["status"])
        self.prompt_tokens = Counter(r, p + "prompt_tokens_total", "Prompt tokens admitted")
        self.generation_tokens = Counter(r, p + "generation_tokens_total", "Tokens generated")
        self.throughput = Gauge(r, p + "generation_tokens_per_second",
                                f"Generated tokens per second over the last "
                                f"{throughput_window_s:g} s")
        self.ttft = Histogram(r, p + "time_to_first_token_seconds",
                              "Time from arrival to the first generated token", TTFT_BUCKETS)
        self.tpot = Histogram(r, p + "time_per_output_token_seconds",
                              "Mean time per output token after the first, per request",
                              TPOT_BUCKETS)
        self.itl = Histogram(r, p + "inter_token_latency_seconds",
                             "Time between a request's successive generated tokens (each gap)",
                             TPOT_BUCKETS)
        self.queue_time = Histogram(r, p + "request_queue_time_seconds",
                                    "Time a request waited for admission into the running batch",
                                    E2E_BUCKETS)
        self.e2e = Histogram(r, p + "e2e_request_latency_seconds",
                             "Time from arrival to the last token", E2E_BUCKETS)
        self.step_time = Histogram(r, p + "engine_step_seconds", "Wall time of one engine step",
                                   STEP_BUCKETS)
        self.engine_errors = Counter(r, p + "engine_errors_total",
                                     "Engine steps that raised (their requests failed)")
        self.preemptions = Counter(r, p + "num_preemptions_total",
                                   "Running requests preempted for waiting requests of higher "
                                   "priority (recomputed later; vLLM's num_preemptions)")
        self.kv_blocks = Gauge(r, p + "kv_blocks", "KV blocks in use per region", ["region"])
        self.kv_usage = Gauge(r, p + "kv_cache_usage_perc",
                              "KV-cache usage: the fraction of every region's KV blocks in use "
                              "(1: all; vLLM's kv_cache_usage_perc)")
        self.planner_cpu_share = Gauge(r, p + _PLANNER_NAMES["planner.cpu_share"][0],
                                       _PLANNER_NAMES["planner.cpu_share"][1])
        self.planner_error = Gauge(r, p + _PLANNER_NAMES["planner.prediction_error"][0],
                                   _PLANNER_NAMES["planner.prediction_error"][1])
        info = Gauge(r, p + "model_info", "The served model", ["model"])
        info.set(1, {"model": model_name})
        self._engine_gauges: dict[str, Gauge] = {}
        self._window = throughput_window_s
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_lock = threading.Lock()

    # -- recorded by the engine loop ------------------------------------------------------------
    def record_step(self, seconds: float, new_tokens: int, now: float | None = None) -> None:
        self.step_time.observe(seconds)
        if new_tokens:
            self.generation_tokens.inc(new_tokens)
            with self._recent_lock:
                self._recent.append((time.monotonic() if now is None else now, new_tokens))

    def record_engine_stats(self, stats: dict, num_running: int, num_waiting: int) -> None:
        self.requests_running.set(num_running)
        self.requests_waiting.set(num_waiting)
        used = cap = 0
        for key, value in stats.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if _KV_BLOCKS.match(key):
                    used += value
                elif key.startswith("kv.capacity_blocks."):
                    cap += value
        if cap:
            self.kv_usage.set(used / cap)
        for key, value in stats.items():
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, (int, float)):
                continue
            m = _KV_BLOCKS.match(key)
            if m:
                self.kv_blocks.set(value, {"region": m.group(1)})
                continue
            if key == "planner.cpu_share":
                self.planner_cpu_share.set(value)
                continue
            if key == "planner.prediction_error":
                self.planner_error.set(value)
                continue
            if key == "engine.preemptions":  # the engine's running count, as a counter
                self.preemptions.inc(max(0, value - self.preemptions.value()))
                continue
            g = self._engine_gauges.get(key)
            if g is None:
                name = PREFIX + "engine_" + sanitize_name(key)
                if self.registry.get(name) is not None:
                    continue
                g = self._engine_gauges[key] = Gauge(self.registry, name,
                                                     f"Engine statistic {key}")
            g.set(value)

    # -- rendered by the HTTP side --------------------------------------------------------------
    def tokens_per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._recent_lock:
            while self._recent and self._recent[0][0] < now - self._window:
                self._recent.popleft()
            total = sum(n for _, n in self._recent)
        return total / self._window

    def render(self) -> str:
        self.throughput.set(self.tokens_per_second())
        return self.registry.render()


_MODEL_LABEL = re.compile(r'model_name="(?:[^"\\]|\\.)*",?')


def parse_text(text: str, keep_model_name: bool = False) -> dict[str, float]:
    """Samples of an exposition as ``{'name{labels}': value}`` (tests, the load generator).
    The ``model_name`` label every series of one server carries is left out of the keys
    unless ``keep_model_name``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if not keep_model_name:
            key = _MODEL_LABEL.sub("", key).replace("{}", "")
        out[key] = float(value)
    return out
