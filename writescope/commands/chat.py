"""``writescope chat``: a conversation with a model in the terminal (vLLM's ``vllm chat``,
llama.cpp's conversation mode), its answers streamed as they are generated.

Each turn sends the whole conversation through the model's chat template; with prefix caching
(on by default) the earlier turns' KV is found in the cache, so a turn computes only its new
tokens -- the figure after each answer says how many prompt tokens came from the cache.
When a turn no longer fits the model's context (its prompt and ``--max-tokens`` past
``max_model_len``, or past the KV budgets), the oldest exchanges are dropped until it does, the
system prompt kept, and the chat says so (llama.cpp's context shift, done on the conversation:
the shortened conversation is a new prefix, computed again; ``--no-context-shift``: nothing is
dropped, such a turn answers in the room the context has left, its answer cut if it reaches the
end of the context (the chat says so), and a turn whose prompt alone does not fit is refused;
``/reset`` starts over).
Lines starting with ``/`` are commands (``/help``); a line ending with ``\\`` continues on the
next (on a terminal readline edits the line and keeps a history, and a multi-line paste is one
message where the terminal brackets pastes); Ctrl-C stops an answer (what was written stays in
the conversation), Ctrl-D, ``/exit`` or Ctrl-C at the prompt ends the chat.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from .common import add_engine_args, engine_kwargs, placement_summary
from .generate import _template_kwargs

HELP = """commands:
  /exit, /quit     end the chat (Ctrl-D too)
  /reset           forget the conversation (the system prompt stays)
  /system TEXT     set the system prompt (and forget the conversation); /system: none
  /help            this list
a line ending with \\ continues on the next; Ctrl-C stops an answer"""


def register(sub) -> None:
    p = sub.add_parser("chat", help="talk with a model in the terminal (multi-turn, streamed)",
                       description="A multi-turn conversation in the terminal, answers streamed. "
                                   "With no --model the embedded default model is used.")
    p.add_argument("--system", default=None, help="the system prompt")
    p.add_argument("--chat-template-kwargs", type=_template_kwargs, default=None, metavar="JSON",
                   help='variables the chat template reads, as a JSON object, e.g. '
                        '\'{"enable_thinking": false}\' for Qwen3')
    p.add_argument("--max-tokens", type=int, default=512, help="at most this many tokens an answer")
    # llama.cpp's sampling defaults
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--no-stats", action="store_true",
                   help="no timing line after each answer")
    p.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                   help="never drop the oldest exchanges: a turn answers in the room the "
                        "context has left, and one whose prompt does not fit is refused "
                        "(llama.cpp's flag; by default they are dropped)")
    add_engine_args(p)
    p.set_defaults(func=run)


def _read_message(prompt: str) -> str | None:
    """The user's next message (lines ending with a backslash continue), or None at EOF."""
    lines = []
    while True:
        line = _read_line(prompt if not lines else "... ")
        if line is None:
            return "\n".join(lines) if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def _read_line(prompt: str) -> str | None:
    """One line, without its newline, or None at EOF. On a terminal (stdin and stdout both
    TTYs) through ``input()``, so that readline's line editing and history work (the arrow keys
    typed escape codes into the message); elsewhere read as it comes, the prompt on stderr
    when stdin is a TTY. Bytes that are not UTF-8 become U+FFFD (they were a traceback)."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        try:
            line = input(prompt)
        except EOFError:  # Ctrl-D: the shell's prompt on a line of its own
            print(file=sys.stderr, flush=True)
            return None
    else:
        if sys.stdin.isatty():
            print(prompt, end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            if sys.stdin.isatty():
                print(file=sys.stderr, flush=True)
            return None
        line = line.rstrip("\r\n")
    try:  # a stdin decoding with surrogateescape (a C locale) keeps the bad bytes as surrogates
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return line.encode("utf-8", "replace").decode("utf-8")


def _prepare_stdin() -> None:
    """Bad UTF-8 on stdin is replaced, not an error that ends the chat; on a terminal, readline
    (line editing, history) is loaded for ``input()``."""
    if hasattr(sys.stdin, "reconfigure"):
        try:
            sys.stdin.reconfigure(errors="replace")
        except (ValueError, OSError):
            pass
    if sys.stdin.isatty() and sys.stdout.isatty():
        try:
            import readline  # noqa: F401  (input() uses it once imported)
        except ImportError:
            pass


class Chat:
    """The conversation and one engine; :meth:`answer` streams one turn to ``out``."""

    def __init__(self, llm, params, system: str | None, template_kwargs: dict | None,
                 context_shift: bool = True):
        self.llm, self.params = llm, params
        self.system, self.template_kwargs = system, template_kwargs or {}
        self.context_shift = context_shift
        self.messages: list[dict] = []
        self.turns = 0

    def reset(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.messages = []

    def set_system(self, text: str | None) -> None:
        """A new system prompt (None: none), and a new conversation."""
        self.system, self.messages = text, []

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def answer(self, text: str, out, err) -> dict | None:
        """Streams the answer to ``text`` to ``out``; returns the turn's figures (None when the
        conversation no longer fits the model's context: the message is then not kept).
        Ctrl-C from the start of the turn to its end stops the answer (between steps) and
        never leaves the conversation half-updated."""
        with _StopOnInterrupt() as stop:
            return self._answer(text, out, err, stop)

    def _answer(self, text: str, out, err, stop: "_StopOnInterrupt") -> dict | None:
        from ..core import RequestTooLargeError
        from ..models.tokenizer import TokenizerError

        engine = self.llm.engine
        self.messages.append({"role": "user", "content": text})
        self.turns += 1
        rid = f"chat-{self.turns}"
        dropped = 0
        while True:
            try:
                ids = list(self.llm.tokenizer.apply_chat_template(self.conversation(),
                                                                  add_generation_prompt=True,
                                                                  **self.template_kwargs))
            except TokenizerError as e:  # the template rejects this conversation: not kept
                self.messages.pop()
                print(f"[{e}]", file=err, flush=True)
                return None
            room = engine.max_model_len - len(ids)
            if self.context_shift and len(self.messages) > 1 and room < (self.params.max_tokens
                                                                         or 1):
                dropped += self._drop_oldest()
                continue
            try:
                engine.add_request(rid, ids, self.params)
            except RequestTooLargeError as e:
                if self.context_shift and len(self.messages) > 1:  # past the KV budgets
                    dropped += self._drop_oldest()
                    continue
                self.messages.pop()
                hint = "/reset starts a new conversation" if len(self.messages) else \
                    "a shorter message may fit"
                print(f"[{e}; {hint}]", file=err, flush=True)
                return None
            break
        if dropped:
            print(f"[the context is full (max_model_len {engine.max_model_len}): the "
                  f"{dropped} oldest messages are dropped]", file=err, flush=True)
        t0 = time.perf_counter()
        first, last, stopped = None, None, False
        # Ctrl-C is seen between steps, never inside one
        while engine.has_unfinished_requests():
            if stop.asked:  # the answer ends here; what was written stays
                engine.abort_request(rid)
                stopped = True
                break
            for o in engine.step():
                if o.request_id != rid:
                    continue
                if first is None and o.token_ids:
                    first = time.perf_counter()
                out.write(o.text[len(last.text) if last else 0:])
                out.flush()
                last = o
            if last is not None and last.finish_reason is not None:
                break
        out.write("\n")
        out.flush()
        if stopped:  # after the answer's newline: no empty line below it on a terminal
            print("[stopped]", file=err, flush=True)
        elif (last is not None and last.finish_reason == "length"
              and len(ids) + len(last.token_ids) >= engine.max_model_len):
            # cut by the context, not by --max-tokens: the next turn cannot fit either
            then = ("the next turn drops the oldest messages" if self.context_shift
                    else "/reset starts a new conversation")
            print(f"[the answer reached the end of the context (max_model_len "
                  f"{engine.max_model_len}); {then}]", file=err, flush=True)
        self.messages.append({"role": "assistant", "content": last.text if last else ""})
        end = time.perf_counter()
        n = len(last.token_ids) if last else 0
        return {"prompt_tokens": len(ids), "cached_tokens": last.num_cached_tokens if last else 0,
                "tokens": n, "ttft_s": (first or end) - t0,
                "tok_s": (n - 1) / (end - first) if first and n > 1 and end > first else 0.0}

    def _drop_oldest(self) -> int:
        """Forget the oldest exchange (a message and its answer, or a lone message): the
        count of messages forgotten."""
        n = 2 if len(self.messages) > 2 and self.messages[1]["role"] == "assistant" else 1
        del self.messages[:n]
        return n


class _StopOnInterrupt:
    """While open, Ctrl-C (SIGINT) only sets :attr:`asked` (in the main thread; elsewhere it
    changes nothing), so that a step is never cut in the middle."""

    def __enter__(self):
        self.asked, self._old = False, None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._ask)
        return self

    def _ask(self, *_):
        self.asked = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


def run(args: argparse.Namespace) -> int:
    from ..core import SamplingParams
    from ..llm import LLM

    # checked before the model loads: a bad flag is an error at once, not after the weights
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                            max_tokens=args.max_tokens,
                            seed=args.seed if args.temperature > 0 else None)
    llm = LLM(**engine_kwargs(args), show_progress=True)
    if llm.tokenizer is None:
        raise ValueError("this model has no tokenizer, so no chat template")
    chat = Chat(llm, params, args.system, args.chat_template_kwargs, args.context_shift)
    _prepare_stdin()
    print(placement_summary(llm.engine), file=sys.stderr)
    print(f"chatting with {llm.engine.model_name} (/help for commands, Ctrl-D to end)",
          file=sys.stderr, flush=True)
    while True:
        try:
            text = _read_message("> ")
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if text is None:
            return 0
        cmd = text.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return 0
        if cmd == "/help":
            print(HELP, file=sys.stderr, flush=True)
            continue
        if cmd == "/reset":
            chat.reset()
            print("[conversation forgotten]", file=sys.stderr, flush=True)
            continue
        if cmd == "/system" or cmd.startswith("/system "):
            chat.set_system(cmd[len("/system"):].strip() or None)
            print(f"[system prompt {'set' if chat.system else 'removed'}, conversation forgotten]",
                  file=sys.stderr, flush=True)
            continue
        if cmd.startswith("/"):
            print(f"[unknown command {cmd.split()[0]}; /help lists them]", file=sys.stderr,
                  flush=True)
            continue
        figures = chat.answer(text, sys.stdout, sys.stderr)
        try:  # a Ctrl-C landing as the answer ends stops nothing more: the chat goes on
            if figures is not None and not args.no_stats:
                f = figures
                print(f"[{f['tokens']} tokens, first after {f['ttft_s'] * 1e3:.0f} ms "
                      f"({f['cached_tokens']} of {f['prompt_tokens']} prompt tokens cached), "
                      f"{f['tok_s']:.1f} tokens/s]", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print(file=sys.stderr, flush=True)
