"""``writescope serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

SIGTERM (or Ctrl-C) shuts down gracefully: the server stops accepting connections, running
requests get ``--shutdown-timeout`` seconds to finish, the rest are cancelled through the engine
(streams end with ``finish_reason: "abort"``, their KV is freed), the engine thread stops, and
the process exits 0 (130 for Ctrl-C).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys

#: server/tool_parsers.py's PARSERS (not imported here: the CLI starts without pydantic)
TOOL_PARSERS = ("hermes", "mistral", "qwen3_coder")
#: server/reasoning.py's PARSERS
REASONING_PARSERS = ("deepseek_r1", "qwen3")


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (the resolver would take 99999 modulo 65536)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be from 0 to 65535, got {n}")
    return n


def _names(values: list[str]) -> list[str]:
    """A list flag's values: given as words (``--allowed-origins a b``) or, as older vLLM takes
    them, one JSON list (``--allowed-origins '["a", "b"]'``)."""
    if len(values) == 1 and values[0].lstrip().startswith("["):
        try:
            parsed = json.loads(values[0])
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list of strings: {values[0]!r} ({e})") from None
        if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
            raise ValueError(f"not a JSON list of strings: {values[0]!r}")
        return parsed
    return list(values)


def cors_options(args: argparse.Namespace):
    """The CORS rules the flags give (server/api.py's :class:`CORS`)."""
    from ..server.api import CORS
    return CORS(allowed_origins=tuple(_names(args.allowed_origins)),
                allow_credentials=bool(args.allow_credentials),
                allowed_methods=tuple(_names(args.allowed_methods)),
                allowed_headers=tuple(_names(args.allowed_headers)))


def register(subparsers) -> None:
    from .common import add_engine_args

    p = subparsers.add_parser(
        "serve", help="serve an OpenAI-compatible HTTP API with continuous batching",
        description="Serve /v1/completions, /v1/chat/completions (streaming and not), "
                    "/v1/responses (OpenAI's Responses API), /v1/models, "
                    "/tokenize, /detokenize, /health, /version, /metrics (Prometheus text) and "
                    "POST /reset_prefix_cache. With no --model, serves the embedded default "
                    "model (it ships a chat template).")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=_port, default=8000,
                   help="port to bind (default 8000; 0 picks a free one, printed when ready)")
    g.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on the /v1 routes")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) clients use (default: the engine's model name)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds running requests get to finish after SIGTERM before they are "
                        "cancelled (default 30)")
    g.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    g.add_argument("--no-access-log", action="store_true", help="do not log every HTTP request")
    g.add_argument("--tool-call-parser", choices=list(TOOL_PARSERS), default=None,
                   help="read tool calls out of the model's text for tool_choice 'auto' "
                        "(hermes: <tool_call>{...}</tool_call> blocks, Hermes / Qwen2.5 / Qwen3; "
                        "qwen3_coder: <tool_call><function=...><parameter=...> blocks, "
                        "Qwen3-Coder; mistral: [TOOL_CALLS] [{...}], Mistral / Mixtral instruct "
                        "models with tool use); without it only 'none', 'required' and named "
                        "functions are served")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's flag, accepted for compatibility: --tool-call-parser enables it")
    g.add_argument("--reasoning-parser", choices=list(REASONING_PARSERS), default=None,
                   help="return a thinking model's <think>...</think> as the chat message's "
                        "reasoning_content, apart from its content (qwen3: Qwen3, reasoning "
                        "when the output or the prompt opens <think>; deepseek_r1: reasoning "
                        "until </think>); a response_format or forced tool call then holds "
                        "after the reasoning")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="render a chat request's own chat_template (vLLM's flag; a template is "
                        "code the server runs: without it such requests get a 400)")
    g.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="name log-probabilities' tokens 'token_id:N' unless a request says "
                        "otherwise (vLLM's flag)")
    g.add_argument("--responses-store", action=argparse.BooleanOptionalAction, default=True,
                   help="keep /v1/responses responses in memory (store, OpenAI's default true) "
                        "for GET /v1/responses/{id}, previous_response_id, input_items and "
                        "background responses (default on); --no-responses-store keeps none: "
                        "store true is answered as store false, as vLLM does with "
                        "VLLM_ENABLE_RESPONSES_API_STORE off, and background is refused")
    c = p.add_argument_group("CORS (browsers' cross-origin requests; vLLM's flags)")
    c.add_argument("--allowed-origins", nargs="+", default=["*"], metavar="ORIGIN",
                   help="origins allowed (default *; words or one JSON list)")
    c.add_argument("--allow-credentials", action="store_true",
                   help="allow credentials (cookies, Authorization) in cross-origin requests")
    c.add_argument("--allowed-methods", nargs="+", default=["*"], metavar="METHOD",
                   help="HTTP methods allowed (default *)")
    c.add_argument("--allowed-headers", nargs="+", default=["*"], metavar="HEADER",
                   help="request headers allowed (default *)")
    p.set_defaults(func=run)


def bind_socket(host: str, port: int) -> socket.socket:
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, addr = info[0]
    sock = socket.socket(family, socktype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..engine.engine import LLMEngine
    from ..server.api import GracefulServer, create_app
    from ..server.owner import EngineThread
    from .common import engine_kwargs, placement_summary

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.shutdown_timeout < 0:
        raise ValueError("--shutdown-timeout must be >= 0")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser "
                         f"({'|'.join(TOOL_PARSERS)})")
    cors = cors_options(args)  # a bad flag fails before anything loads
    sock = bind_socket(args.host, args.port)  # bind first: a busy port fails before loading
    host, port = sock.getsockname()[:2]
    # built on the thread that will step it: one OpenMP team behind the engine (owner.py)
    owner = EngineThread()
    try:
        engine = owner.call(LLMEngine, **engine_kwargs(args))
    except BaseException:
        owner.close()
        sock.close()
        raise
    if engine.tokenizer is None:
        owner.close()
        sock.close()
        raise ValueError(f"model {engine.model_name} has no tokenizer files; the server needs one")
    url_host = f"[{host}]" if ":" in host else host

    def ready() -> None:
        print(f"writescope serve: {engine.model_name} ready on http://{url_host}:{port} "
              f"(max_model_len {engine.max_model_len}); {placement_summary(engine)}", flush=True)

    app = create_app(engine, served_model_names=args.served_model_name, api_key=args.api_key,
                     on_ready=ready, engine_thread=owner, tool_call_parser=args.tool_call_parser,
                     reasoning_parser=args.reasoning_parser,
                     trust_request_chat_template=args.trust_request_chat_template,
                     return_tokens_as_token_ids=args.return_tokens_as_token_ids, cors=cors,
                     responses_store=args.responses_store)
    config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level,
                            access_log=not args.no_access_log, lifespan="on",
                            timeout_graceful_shutdown=10.0)  # backstop after our own grace
    server = GracefulServer(config, app, grace_s=args.shutdown_timeout)
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully; with the
    # default SIGTERM action that would kill the process with status -15. Catch it here instead
    # so a graceful stop exits 0.
    previous = signal.signal(signal.SIGTERM, _ignore_signal)
    try:
        server.run(sockets=[sock])
    finally:
        owner.close()  # (where the engine loop ran, it closed the thread already: harmless)
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    if signal.SIGINT in server.stop_signals:  # uvicorn's re-raise was ignored (SIG_IGN
        raise KeyboardInterrupt                # inherited): Ctrl-C's exit all the same
    if not server.started:
        print("writescope serve: the server failed to start", file=sys.stderr)
        return 1
    print("writescope serve: stopped", flush=True)
    return 0


def _ignore_signal(signum, frame) -> None:
    return None
