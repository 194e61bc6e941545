"""Child processes of a cluster run (gateway, nodes): each in its own session, so its whole tree can be killed.

Not thread-safe: owned by the runner's thread (each child's output reader is its own daemon thread).
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

__all__ = ["Child", "Lines"]

Lines = queue.Queue[tuple[str, str | None]]


class Child:
    """A subprocess in its own session. Its stdout and stderr, merged, are written line by line to the file
    ``log`` and put on ``lines`` as (name, line); (name, None) follows the last line."""

    def __init__(self, name: str, argv: list[str], log: Path, lines: Lines, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self._terminated = False
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True, text=True, errors="replace")
        threading.Thread(target=self._read, args=(lines,), daemon=True, name=f"twin-{name}").start()

    def _read(self, lines: Lines) -> None:
        stream: IO[str] | None = self.proc.stdout
        assert stream is not None
        with open(self.log, "w", buffering=1) as log:
            for line in stream:
                log.write(line)
                lines.put((self.name, line.rstrip("\n")))
        lines.put((self.name, None))

    @property
    def terminated(self) -> bool:
        """Whether :meth:`terminate` sent its SIGTERM."""
        return self._terminated

    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM, once: an agent forwards the first to its command, but a second one would kill it while it
        detaches its probes and flushes."""
        if not self._terminated and self.running():
            self._terminated = True
            _quiet(lambda: self.proc.send_signal(signal.SIGTERM))

    def kill_descendants(self) -> None:
        """SIGKILL every process of this child's session except the child itself (an agent then sees its
        command end and flushes). Never raises."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.proc.pid:
                continue
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) == self.proc.pid:  # field 6: the session id
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass

    def tail(self, n: int = 8) -> str:
        """The last ``n`` lines of the log, indented, for an error message."""
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-n:]
        except OSError:
            return ""
        return "\n    ".join(["", *text]) if text else " (empty)"

    def stop(self, timeout: float, hurry: threading.Event) -> int | None:
        """SIGTERM, wait up to ``timeout`` (or until ``hurry`` is set), then SIGKILL the whole session:
        leftovers of the tree too. Returns the exit code (None: still not reaped). Never raises."""
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
