"""The command line's process-level behaviour (each subcommand has its own test file)."""
import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    code = ("import sys, threading, time\n"
            "from writescope import cli\n"
            "cli._stack_dumps_on_sigusr1()\n"
            "def parked():\n    time.sleep(30)\n"
            "threading.Thread(target=parked, daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "time.sleep(2.0)\n"
            "print('alive', flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGUSR1)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and out.strip() == "alive"
    assert "most recent call first" in err and "in parked" in err


def test_stacks_every_n_seconds_from_a_watchdog():
    code = ("import time\n"
            "from writescope import cli\n"
            "cli._stack_dumps_on_sigusr1()\n"
            "time.sleep(1.6)\n"
            "print('done', flush=True)\n")
    env = dict(os.environ, WRITESCOPE_STACKS_EVERY_S="0.5")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done"
    assert r.stderr.count("most recent call first") >= 2



def test_every_option_with_a_default_says_it_in_help(capsys):
    """`writescope generate --help` showed --max-tokens, --temperature, --top-k, ... with no
    default (vLLM's and llama.cpp's help name them); each subcommand's options now do."""
    from writescope.cli import build_parser, main
    parser = build_parser()
    missing = [(name, a.option_strings[-1])
               for name, cmd in parser._subparsers._group_actions[0].choices.items()
               for a in cmd._actions
               if a.option_strings and a.default != "==SUPPRESS=="
               and a.default is not None and a.default is not False and a.default != []
               and "default" not in (a.help or "").lower()]
    assert not missing
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-tokens MAX_TOKENS default: 64" in text
    assert "--temperature TEMPERATURE default: 0.0" in text
    assert "--seed SEED random weights' seed" in text and "(default: 0)" in text


def test_version_flag(capsys):
    """`writescope --version` (vLLM's `vllm --version`, llama.cpp's --version) was an
    'unrecognized arguments' error."""
    from writescope import __version__
    from writescope.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"writescope {__version__}"
