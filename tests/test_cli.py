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
