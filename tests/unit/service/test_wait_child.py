"""``run -- CMD``'s wait for its command (service.agent.wait_child) sees a SIGTERM whichever thread takes it.

The kernel may deliver a signal sent to the agent to any thread that does not block it; Python runs the
handler only on the main thread. CI (stop 32) saw a SIGTERM taken by a short-lived compile thread while the
main thread sat in ``waitpid``: the command was never told and the run never ended. Here the main thread blocks
SIGTERM, so the kernel must hand it to the other thread: the same case, every time.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    from otel_ebpf.service.agent import wait_child

    child = subprocess.Popen(["sleep", "60"])
    threading.Thread(target=lambda: time.sleep(60), daemon=True).start()  # unblocked: it takes the signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.{sig}}})
    print("ready", flush=True)
    t0 = time.monotonic()
    code = wait_child(child.pid, lambda s: print("signal", s, flush=True))
    print("code", code, round(time.monotonic() - t0, 1), flush=True)
""")


def _run(sig: str) -> tuple[list[str], float]:
    """The script's output lines after ``sig`` was sent to it, and how long it took to end."""
    p = subprocess.Popen([sys.executable, "-c", SCRIPT.format(sig=sig)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n"
        time.sleep(0.3)  # into the wait
        t0 = time.monotonic()
        os.kill(p.pid, getattr(signal, sig))
        out, _ = p.communicate(timeout=20)
        return out.split("\n"), time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigterm_taken_by_another_thread_is_forwarded():
    lines, _ = _run("SIGTERM")
    assert lines[0] == f"signal {int(signal.SIGTERM)}", lines
    assert lines[1].startswith(f"code {128 + signal.SIGTERM} "), lines  # the command ended by the forwarded signal


def test_sighup_taken_by_another_thread_is_forwarded():
    lines, _ = _run("SIGHUP")
    assert lines[0] == f"signal {int(signal.SIGHUP)}", lines
    assert lines[1].startswith(f"code {128 + signal.SIGHUP} "), lines
