"""Serving load generator: throughput, TTFT and TPOT percentiles of an OpenAI-compatible server.

    python -m writescope.bench.serve                      # launches `writescope serve` on loopback
    python -m writescope.bench.serve --num-requests 200 --request-rate 8 --concurrency 32 \\
        --prompt-len uniform:64:512 --output-len normal:128:32 -- --model ... --dtype bfloat16
    python -m writescope.bench.serve --base-url http://127.0.0.1:8000   # an already running server

Requests are streaming ``/v1/completions`` (or ``/v1/chat/completions`` with ``--endpoint chat``).
Completions prompts are random token ids, so prompt lengths are exact; ``ignore_eos`` makes the
output length exact too. Arrivals are a Poisson process of ``--request-rate`` requests/s (``inf``:
all at once) with at most ``--concurrency`` in flight. Per request it records TTFT (send to first
streamed text), TPOT ((last - first token time) / (output tokens - 1)), the gaps between streamed
chunks (ITL) and end-to-end latency; the report gives mean/p50/p90/p99 of each and the achieved
request and token throughput. The method follows vLLM's ``benchmarks/benchmark_serving.py``
(the metric definitions) -- written here for this server, loopback only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .provenance import git_info


# ---------------------------------------------------------------------------------- lengths
@dataclass(frozen=True)
class LengthDist:
    """``128`` (fixed), ``uniform:LO:HI``, ``normal:MEAN:STD``, ``exp:MEAN`` (all clipped >= 1)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "LengthDist":
        parts = str(text).split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", float(int(parts[0])))
            kind, nums = parts[0].lower(), [float(x) for x in parts[1:]]
        except ValueError:
            raise argparse.ArgumentTypeError(f"cannot read length distribution {text!r}") from None
        if kind == "uniform" and len(nums) == 2 and 1 <= nums[0] <= nums[1]:
            return cls(kind, nums[0], nums[1])
        if kind == "normal" and len(nums) == 2 and nums[0] >= 1 and nums[1] >= 0:
            return cls(kind, nums[0], nums[1])
        if kind in ("exp", "exponential") and len(nums) == 1 and nums[0] >= 1:
            return cls("exp", nums[0])
        raise argparse.ArgumentTypeError(
            f"bad length distribution {text!r}: use N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN")

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, n)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, n)
        else:
            x = rng.exponential(self.a, n)
        return [max(1, int(round(v))) for v in x]

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "exp":
            return f"exp:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


# ---------------------------------------------------------------------------------- one request
@dataclass
class Result:
    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = float("nan")
    tpot: float = float("nan")
    e2e: float = float("nan")
    itl: list[float] = field(default_factory=list)
    error: str = ""


def _percentiles(xs: list[float]) -> dict:
    a = np.array([x for x in xs if x == x], dtype=float)
    if a.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "n": 0}
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "n": int(a.size)}


async def _one(client, url: str, body: dict, prompt_len: int, headers: dict) -> Result:
    t0 = time.perf_counter()
    first = last = None
    res = Result(ok=False, prompt_len=prompt_len)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if "error" in msg:
                    res.error = str(msg["error"].get("message"))
                    return res
                if msg.get("usage"):
                    res.output_len = msg["usage"]["completion_tokens"]
                for ch in msg.get("choices", []):
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if text:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            res.itl.append(now - last)
                        last = now
    except Exception as e:  # noqa: BLE001 -- counted as a failed request
        res.error = f"{type(e).__name__}: {e}"
        return res
    end = time.perf_counter()
    res.e2e = end - t0
    if first is not None:
        res.ttft = first - t0
        if res.output_len > 1:
            res.tpot = (last - first) / (res.output_len - 1)
    res.ok = True
    return res


async def run_load(base_url: str, *, model: str | None, num_requests: int, request_rate: float,
                   concurrency: int, prompt_len: LengthDist, output_len: LengthDist,
                   endpoint: str = "completions", seed: int = 0, api_key: str | None = None,
                   token_range: tuple[int, int] = (16, 1000), timeout_s: float = 600.0) -> dict:
    import httpx

    rng = np.random.default_rng(seed)
    plens = prompt_len.sample(rng, num_requests)
    olens = output_len.sample(rng, num_requests)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        r = await client.get("/v1/models", headers=headers)
        r.raise_for_status()
        card = r.json()["data"][0]
        model = model or card["id"]
        max_len = card.get("max_model_len")
        bodies = []
        for pl, ol in zip(plens, olens):
            if max_len is not None and pl + ol > max_len:
                pl = max(1, min(pl, max_len - ol - 1))
                ol = max(1, min(ol, max_len - pl))
            body = {"model": model, "max_tokens": ol, "stream": True, "temperature": 0.0,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            if endpoint == "chat":
                words = " ".join(f"w{int(x)}" for x in rng.integers(0, 1000, pl))
                body["messages"] = [{"role": "user", "content": words}]
            else:
                body["prompt"] = [int(x) for x in rng.integers(token_range[0], token_range[1], pl)]
            bodies.append((body, pl))
        url = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        sem = asyncio.Semaphore(concurrency)

        async def limited(body, pl):
            async with sem:
                return await _one(client, url, body, pl, headers)

        tasks = []
        t_start = time.perf_counter()
        for body, pl in bodies:
            tasks.append(asyncio.create_task(limited(body, pl)))
            if request_rate != float("inf"):
                await asyncio.sleep(float(rng.exponential(1.0 / request_rate)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t_start
        server_metrics = {}
        try:
            from ..server.metrics import parse_text
            m = parse_text((await client.get("/metrics")).text)
            server_metrics = {k: v for k, v in m.items()
                              if k.startswith(("writescope_kv_blocks", "writescope_planner_",
                                               "writescope_request_success_total"))}
        except Exception:  # noqa: BLE001 -- a foreign server may have no /metrics
            pass
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    return {
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput_rps": len(ok) / duration,
        "output_throughput_tok_s": out_tokens / duration,
        "total_throughput_tok_s": (in_tokens + out_tokens) / duration,
        "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "ttft_s": _percentiles([r.ttft for r in ok]),
        "tpot_s": _percentiles([r.tpot for r in ok]),
        "itl_s": _percentiles([x for r in ok for x in r.itl]),
        "e2e_s": _percentiles([r.e2e for r in ok]),
        "server_metrics": server_metrics,
    }


# ---------------------------------------------------------------------------------- launching
class LaunchedServer:
    """``writescope serve --port 0`` in a subprocess; its URL read from the ready line.

    ``LaunchedServer(args)`` starts the process and returns at once; :meth:`wait_ready` blocks
    until the server prints its ready line (or raises with the process's last output).
    ``preexec_fn``: run in the child before it starts (``subprocess.Popen``'s)."""

    def __init__(self, serve_args: list[str], env: dict | None = None,
                 preexec_fn=None) -> None:
        cmd = [sys.executable, "-m", "writescope.cli", "serve", "--host", "127.0.0.1",
               "--port", "0", "--no-access-log", "--log-level", "warning", *serve_args]
        self.cmd = cmd
        root = str(Path(__file__).resolve().parents[2])  # the checkout, for an uninstalled package
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1, env=env,
                                     preexec_fn=preexec_fn)
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.url is None and " ready on http" in line:
                self.url = line.split(" ready on ")[1].split()[0]
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout_s: float = 300.0) -> str:
        if not self._ready.wait(timeout_s) or self.url is None:
            self.stop()
            raise RuntimeError(f"the server did not start ({shlex.join(self.cmd)}):\n"
                               + "\n".join(self.lines[-40:]))
        return self.url

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "loadavg_1_5_15": list(os.getloadavg()),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    try:
        import torch
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def _jsonable(v):
    if isinstance(v, LengthDist):
        return str(v)
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


def _fmt(stat: dict, scale: float = 1000.0) -> str:
    if stat["mean"] is None:
        return "n/a"
    return (f"mean {stat['mean'] * scale:8.1f}  p50 {stat['p50'] * scale:8.1f}  "
            f"p90 {stat['p90'] * scale:8.1f}  p99 {stat['p99'] * scale:8.1f}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    original = list(argv)
    serve_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m writescope.bench.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None,
                   help="a running server (loopback); default: launch `writescope serve` with "
                        "the arguments after --")
    p.add_argument("--model", default=None,
                   help="model name to request (default: the first served)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="mean arrivals per second (Poisson); inf sends all at once")
    p.add_argument("--concurrency", type=int, default=16, help="most requests in flight")
    p.add_argument("--prompt-len", type=LengthDist.parse,
                   default=LengthDist.parse("uniform:16:128"))
    p.add_argument("--output-len", type=LengthDist.parse, default=LengthDist.parse("uniform:16:64"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2, help="requests sent first and not counted")
    p.add_argument("--json", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    if args.num_requests < 1 or args.concurrency < 1 or args.request_rate <= 0:
        p.error("--num-requests, --concurrency and --request-rate must be positive")
    host = None
    if args.base_url is not None:
        from urllib.parse import urlparse
        host = urlparse(args.base_url).hostname
        if host not in ("127.0.0.1", "localhost", "::1") and not str(host).startswith("127."):
            p.error("this load generator only targets loopback addresses")
    server = None
    base_url = args.base_url
    if base_url is None:
        if not serve_args:  # the default model; float32 where there is no GPU
            import torch
            serve_args = [] if torch.cuda.is_available() else ["--dtype", "float32"]
        print(f"launching: writescope serve {shlex.join(serve_args)}", flush=True)
        server = LaunchedServer(serve_args)
        base_url = server.wait_ready()
    machine = _machine()  # before the run: the load average says how busy the machine was
    common = dict(model=args.model, request_rate=args.request_rate,
                  concurrency=args.concurrency, prompt_len=args.prompt_len,
                  output_len=args.output_len, endpoint=args.endpoint, api_key=args.api_key)
    try:
        if args.warmup:
            asyncio.run(run_load(base_url, num_requests=args.warmup, seed=args.seed + 1,
                                 **{**common, "request_rate": float("inf")}))
        res = asyncio.run(run_load(base_url, num_requests=args.num_requests, seed=args.seed,
                                   **common))
    finally:
        rc = server.stop() if server is not None else None
    print(f"\nrequests: {res['completed']} completed, {res['failed']} failed "
          f"in {res['duration_s']:.2f} s")
    for e in res["errors"]:
        print(f"  error: {e}")
    print(f"throughput: {res['request_throughput_rps']:.2f} req/s, "
          f"{res['output_throughput_tok_s']:.1f} output tok/s, "
          f"{res['total_throughput_tok_s']:.1f} total tok/s")
    print(f"TTFT (ms): {_fmt(res['ttft_s'])}")
    print(f"TPOT (ms): {_fmt(res['tpot_s'])}")
    print(f"ITL  (ms): {_fmt(res['itl_s'])}")
    print(f"E2E  (ms): {_fmt(res['e2e_s'])}")
    if server is not None:
        print(f"server exit status after SIGTERM: {rc}")
    if args.json:
        git = git_info()
        out = {"benchmark": "serve", "commit": git["commit"],
               "work_tree_modified": git["dirty"], "source_digest": git["source_digest"],
               "machine": machine,
               "command": "python -m writescope.bench.serve " + shlex.join(original),
               "config": {**{k: _jsonable(v) for k, v in vars(args).items()},
                          "serve_args": serve_args},
               "server_exit_status": rc, "result": res}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=float) + "\n")
        print(f"wrote {args.json}")
    return 0 if res["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
