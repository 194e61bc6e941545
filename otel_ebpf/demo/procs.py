"""The demo's child processes: each in its own session, so its whole tree can be killed.

Not thread-safe: owned by the runner's main thread (the stdout reader is its own thread).
"""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["Child"]


class Child:
    """A subprocess in its own session; its stdout lines go to ``lines`` as (name, line), and
    (name, None) at EOF; its stderr to the file ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, lines: queue.Queue[tuple[str, str | None]],
                 env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self._terminated = False
        with open(log, "wb") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, text=True)
        threading.Thread(target=self._read, args=(lines,), daemon=True, name=f"demo-{name}").start()

    def _read(self, lines: queue.Queue[tuple[str, str | None]]) -> None:
        stream: IO[str] | None = self.proc.stdout
        assert stream is not None
        for line in stream:
            lines.put((self.name, line.rstrip("\n")))
        lines.put((self.name, None))

    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM, once: an agent forwards the first to its command, but a second one would
        kill it while it detaches its probes and flushes."""
        if not self._terminated and self.running():
            self._terminated = True
            _quiet(lambda: self.proc.send_signal(signal.SIGTERM))

    def tail(self, n: int = 8) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-n:]
        except OSError:
            return ""
        return "\n    ".join(["", *text]) if text else " (empty)"

    def stop(self, timeout: float, hurry: threading.Event) -> int | None:
        """SIGTERM, wait up to ``timeout`` (or until ``hurry`` is set), then SIGKILL the whole
        session: leftovers of the tree too. Never raises."""
        if self.running():
            self.terminate()
            deadline = time.monotonic() + timeout
            while self.running() and time.monotonic() < deadline and not hurry.is_set():
                time.sleep(0.1)
        _quiet(lambda: os.killpg(self.proc.pid, signal.SIGKILL))
        try:
            # A killed agent still releases its uprobes one by one in the kernel as it exits.
            return self.proc.wait(timeout=1 if hurry.is_set() else 30)
        except subprocess.TimeoutExpired:
            return None


def _quiet(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except (OSError, ValueError):
        pass

