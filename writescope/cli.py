"""``writescope`` command line: one module per subcommand under ``writescope/commands``.

Each command module defines ``register(subparsers)`` (adds its parser, sets ``func``).
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys

COMMANDS = ("generate", "chat", "serve", "bench", "calibrate", "plan")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="writescope",
        description="Long-context MoE inference on one budgeted GPU.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"writescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"writescope.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"writescope.commands.{name}":
                raise
            continue
        mod.register(sub)
    for cmd in sub.choices.values():
        _name_defaults(cmd)
    return parser


def _name_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's help says its default (``--max-tokens`` had no help line at all): one
    whose help does not mention a default gets ``(default: X)``; flags and options without
    a default (None) are left as they are."""
    for action in parser._actions:
        if (not action.option_strings or action.help == argparse.SUPPRESS
                or action.default is None or action.default is False  # not 0: a default
                or action.default == argparse.SUPPRESS
                or isinstance(action.default, list) and not action.default
                or "default" in (action.help or "").lower()):
            continue
        action.help = f"{action.help} (default: %(default)s)" if action.help \
            else "default: %(default)s"


def _stack_dumps_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every Python thread's stack to stderr and goes on (what
    ``py-spy dump`` shows, without installing it): where a long bench row or a stuck request is.
    ``WRITESCOPE_STACKS_EVERY_S=N`` prints them every N seconds from a watchdog thread instead
    (that works too when the main thread sits in a driver call a signal cannot interrupt)."""
    try:
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
        every = float(os.environ.get("WRITESCOPE_STACKS_EVERY_S") or 0)
        if every > 0:
            faulthandler.dump_traceback_later(every, repeat=True)
    except (ValueError, RuntimeError, OSError):  # stderr without a file descriptor
        pass


def main(argv: list[str] | None = None) -> int:
    _stack_dumps_on_sigusr1()
    try:  # the command modules import torch: seconds a Ctrl-C may come in
        parser = build_parser()
    except KeyboardInterrupt:
        print("\nwritescope: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback
        print(f"\nwritescope {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `writescope plan ... | head`: the reader left; no traceback
        try:  # and none from the interpreter's own flush of stdout at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe closed on
    except (ValueError, OSError, MemoryError) as e:  # OSError: a file or folder given
        print(f"writescope {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
