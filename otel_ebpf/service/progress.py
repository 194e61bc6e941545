"""A live progress line for ``otel-ebpf run`` on a terminal.

::

    otel-ebpf  0:42  events 1.2M (31.0k/s)  spans 48.1k (1.2k/s)  dropped 0  probes 26 (0 failed)  procs 9

Redrawn about once a second on the terminal's bottom line, only when stderr is a terminal and
``--quiet`` was not given; a piped stderr is left alone. The traced command shares the terminal,
so the line lives outside the scroll region (DECSTBM, as apt's progress bar does): the command's
output scrolls above it and never mixes with it. Counts come from the agent's own telemetry
(``Agent.summary()``), the same numbers the end-of-run summary prints.

Thread safety: one daemon thread reads the summary (thread-safe counters) and draws;
``stop`` restores the full scroll region and erases the line before the summary is printed.
"""
from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "human", "render_line"]


def human(n: float) -> str:
    """1234 -> '1.2k', 5_600_000 -> '5.6M'."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def render_line(now: dict[str, int], before: dict[str, int] | None, elapsed: float, dt: float) -> str:
    """The progress text for summary ``now``; rates from ``before``, ``dt`` seconds earlier."""
    def rate(key: str) -> str:
        if before is None or dt <= 0:
            return ""
        return f" ({human(max(0, now[key] - before[key]) / dt)}/s)"

    minutes, seconds = divmod(int(elapsed), 60)
    parts = [f"otel-ebpf {minutes:2d}:{seconds:02d}",
             f"events {human(now['events'])}{rate('events')}",
             f"spans {human(now['spans'])}{rate('spans')}",
             f"dropped {human(now['dropped'])}",
             f"probes {now['probes']} ({now['probe_failures']} failed)"]
    if "processes" in now:
        parts.append(f"procs {now['processes']}")
    return "  ".join(parts)


class Progress:
    """Redraws :func:`render_line` every ``interval`` seconds on ``stream`` while started.

    ``summary`` is called from the progress thread and must be thread safe. ``start`` does nothing
    when ``stream`` is not a TTY (see :attr:`enabled`); ``stop`` is safe twice and without start.
    """

    def __init__(self, summary: Callable[[], dict[str, int]], stream: TextIO, *, interval: float = 1.0,
                 force: bool = False) -> None:
        self._summary = summary
        self._stream = stream
        self._interval = interval
        isatty = getattr(stream, "isatty", None)
        self.enabled = force or bool(isatty and isatty())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False
        self._region_rows = 0  # terminal rows when the scroll region was set; 0: not set
        self._lock = threading.Lock()

    def _rows(self) -> tuple[int, int]:
        try:
            size = os.get_terminal_size(self._stream.fileno())
            return size.lines, size.columns
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return 24, 80

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        rows, _ = self._rows()
        if rows < 3:  # no room for a status line
            self.enabled = False
            return
        self._region_rows = rows
        with self._lock:  # a new line, then scroll region = all rows but the last (cursor saved around it)
            self._stream.write(f"\n\x1b7\x1b[1;{rows - 1}r\x1b8\x1b[1A")
            self._stream.flush()
        self._thread = threading.Thread(target=self._run, name="otel-ebpf-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = last_t = time.monotonic()
        last: dict[str, int] | None = None
        while not self._stop.wait(self._interval):
            try:
                now_t, now = time.monotonic(), self._summary()
                self._draw(render_line(now, last, now_t - t0, now_t - last_t))
                last, last_t = now, now_t
            except Exception:  # a progress line must never disturb the run
                return

    def _draw(self, text: str) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            _, cols = self._rows()
            self._stream.write(f"\x1b7\x1b[{self._region_rows};1H\x1b[2K{text[:max(cols - 1, 1)]}\x1b8")
            self._stream.flush()
            self._drawn = True

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            if self._region_rows:  # full scroll region back, status line erased
                rows = self._region_rows
                self._stream.write(f"\x1b7\x1b[1;{rows}r\x1b[{rows};1H\x1b[2K\x1b8")
                self._stream.flush()
                self._region_rows = 0
