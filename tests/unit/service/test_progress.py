"""The live progress line of ``otel-ebpf run`` (otel_ebpf.service.progress)."""
from __future__ import annotations

import io
import itertools
import time

from otel_ebpf.service.progress import Progress, human, render_line


def summary(events: int, spans: int, dropped: int = 0) -> dict[str, int]:
    return {"events": events, "spans": spans, "dropped": dropped, "probes": 26, "probe_failures": 1}


def test_counts_and_rates_are_human_sized() -> None:
    assert [human(x) for x in (0, 999, 1234, 5_600_000, 2.5)] == ["0", "999", "1.2k", "5.6M", "2.5"]
    line = render_line(summary(62_000, 2_400, 3), summary(31_000, 1_200), elapsed=125.0, dt=2.0)
    assert line == ("otel-ebpf  2:05  events 62.0k (15.5k/s)  spans 2.4k (600/s)  dropped 3  "
                    "probes 26 (1 failed)")
    assert "/s" not in render_line(summary(1, 1), None, elapsed=1.0, dt=0.0)


def test_not_a_terminal_means_no_output() -> None:
    out = io.StringIO()
    p = Progress(lambda: summary(1, 1), out, interval=0.01)
    p.start()
    time.sleep(0.05)
    p.stop()
    assert not p.enabled and out.getvalue() == ""


def test_line_is_drawn_on_the_reserved_bottom_row_and_removed_at_stop() -> None:
    out = io.StringIO()
    counter = itertools.count()
    p = Progress(lambda: summary(next(counter) * 100, 0), out, interval=0.02, force=True)
    p.start()
    deadline = time.monotonic() + 5
    while "events 100" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    p.stop()
    p.stop()  # safe twice
    text = out.getvalue()
    # StringIO has no terminal size: 24 rows assumed; rows 1-23 scroll, row 24 holds the line.
    assert text.startswith("\n\x1b7\x1b[1;23r\x1b8\x1b[1A")
    assert "\x1b7\x1b[24;1H\x1b[2Kotel-ebpf  0:00  events 100 (" in text
    assert text.endswith("\x1b7\x1b[1;24r\x1b[24;1H\x1b[2K\x1b8")
