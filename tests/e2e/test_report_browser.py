"""The HTML report in a real browser: Debian's headless ``chromium``, offline, driven over the
DevTools protocol (``--remote-debugging-pipe``: commands on fd 3, replies and events on fd 4,
each message JSON ended by a NUL byte).

Two reports, built by ``otel-ebpf report`` from OTLP JSON lines the test writes with the real
file exporters: a CPU PyTorch job (tests/unit/report/cpu_job.py: one process, two threads,
Python and torch rows, no GPU) and a 4-rank NCCL job (tests/unit/report/otlp_job.py: NCCL and
CUDA rows, joined collectives, a straggler). Each page must load without console errors or
exceptions, make no network request (the browser has no network: its own network namespace
when ``unshare -n`` works, and a dead proxy and resolver either way), draw the expected lanes
and rows, and no label may be clipped (every text's box inside its SVG, timeline labels inside
the label column, cards' text inside the card). A full-page screenshot of each is saved under
``$OTEL_EBPF_ARTIFACTS`` when set (.ci/run sets it).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.cli import main
from tests.unit.report import cpu_job, otlp_job

_TIMEOUT = 20.0  # seconds for any one reply (a page loads in well under 1 s)
# Run in the page after it loaded (and two frames later, once a resize redraw is done): what the
# timeline drew and every clipped label.
_PROBE = r"""new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done((() => {
  const svg = document.getElementById("timeline"), box = svg.getBoundingClientRect();
  const labelCol = box.left + Number(svg.getAttribute("data-label-width"));
  const full = t => (t.querySelector("title") || t).textContent;
  const clipped = [];
  const out = (r, c) => r.left < c.left - 0.5 || r.right > c.right + 0.5 || r.top < c.top - 0.5 ||
    r.bottom > c.bottom + 0.5;
  document.querySelectorAll("svg text").forEach(t => {
    const r = t.getBoundingClientRect(), c = t.ownerSVGElement.getBoundingClientRect();
    if (r.width === 0) return;
    if (out(r, c)) clipped.push("svg: " + full(t));
    if ((t.classList.contains("lbl") || t.classList.contains("rlbl")) && r.right > labelCol + 0.5)
      clipped.push("label column: " + full(t));
  });
  document.querySelectorAll(".card .v, .card .l, .chart .ct, .chart .cs, h2").forEach(e => {
    if (e.scrollWidth > e.clientWidth + 1) clipped.push("html: " + e.textContent);
  });
  return {
    lanes: [...svg.querySelectorAll("text.lbl")].map(full),
    straggler_lanes: [...svg.querySelectorAll("text.slbl")].map(full),
    straggler_notes: svg.querySelectorAll("text.snote").length,
    rows: [...svg.querySelectorAll("text.rlbl")].map(full),
    brackets: svg.querySelectorAll("path.life").length,
    bars: svg.querySelectorAll("rect.bar").length,
    ticks: [...svg.querySelectorAll("text.tick")].map(t => t.textContent),
    sections: [...document.querySelectorAll("#metrics h2")].map(e => e.textContent),
    charts: document.querySelectorAll(".chart svg").length,
    value_tables: document.querySelectorAll(".chart table.vals").length,
    cards: Object.fromEntries([...document.querySelectorAll(".card")].map(
      c => [c.querySelector(".l").textContent, [c.querySelector(".v").textContent, c.className]])),
    resources: performance.getEntriesByType("resource").length,
    clipped: clipped,
  };
})()))))"""


class Chromium:
    """Headless chromium on a DevTools pipe. ``call`` sends one command and returns its result;
    events seen meanwhile are kept in ``events``. Not thread-safe (one caller)."""

    def __init__(self, profile: Path) -> None:
        exe = shutil.which("chromium")
        assert exe
        cmd_r, self._cmd_w = os.pipe()  # we write commands; chromium reads fd 3
        self._out_r, out_w = os.pipe()  # chromium writes fd 4; we read
        offline = ["unshare", "-n"] if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0 \
            else []
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile / "chromium.log"

        def fds() -> None:  # in the child: the pipe ends as fd 3 and 4 (via fds above both, whichever they were)
            high = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(high[0], 3)  # dup2 makes them inheritable; Python's own fds are not (PEP 446)
            os.dup2(high[1], 4)

        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*offline, exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio",
                 "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                 f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, close_fds=False,
                preexec_fn=fds)
        os.close(cmd_r)
        os.close(out_w)
        self._next = 0
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._out_r, 1 << 16):
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for m in msgs:
                self._inbox.put(json.loads(m))
        self._inbox.put(None)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + _TIMEOUT
        while True:
            got = self._inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            assert got is not None, f"chromium exited: {self.log.read_text(errors='replace')[-2000:]}"
            if got.get("id") == self._next:
                assert "error" not in got, f"{method}: {got['error']}"
                result: dict[str, Any] = got.get("result", {})
                return result
            self.events.append(got)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + _TIMEOUT
        while True:
            for e in self.events:
                if e.get("method") == method and e.get("sessionId") == session:
                    return e
            got = self._inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            assert got is not None, "chromium exited"
            self.events.append(got)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, queue.Empty, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        self._reader.join(timeout=5)  # EOF once chromium is gone
        os.close(self._out_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    if shutil.which("chromium") is None:  # scripts/setup.sh installs it with the test extras; CI must run this
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: the report cannot be checked in a browser")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    b = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _open(browser: Chromium, page: Path, shot: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Load ``page`` in a fresh tab 1400 px wide; return what _PROBE saw and the tab's events."""
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable", session)
    browser.call("Emulation.setDeviceMetricsOverride", session, width=1400, height=900, deviceScaleFactor=1,
                 mobile=False)
    browser.call("Page.navigate", session, url=page.as_uri())
    browser.wait_event("Page.loadEventFired", session)
    probe = browser.call("Runtime.evaluate", session, expression=_PROBE, returnByValue=True, awaitPromise=True)
    assert "exceptionDetails" not in probe, probe
    if shot and os.environ.get("OTEL_EBPF_ARTIFACTS"):
        size = browser.call("Page.getLayoutMetrics", session)["cssContentSize"]
        png = browser.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                           clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        out = Path(os.environ["OTEL_EBPF_ARTIFACTS"])
        out.mkdir(parents=True, exist_ok=True)
        (out / shot).write_bytes(base64.b64decode(png["data"]))
    events = [e for e in browser.events if e.get("sessionId") == session]
    browser.call("Target.closeTarget", targetId=target)
    return probe["result"]["value"], events


def _problems(page: Path, events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(console errors and exceptions, network requests other than the page itself)."""
    errors = [json.dumps(e["params"])[:500] for e in events if e["method"] == "Runtime.exceptionThrown" or
              (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")) or
              (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    return errors, [u for u in requests if u != page.as_uri()]


def test_the_checks_see_a_page_that_reaches_out_and_errs(browser: Chromium, tmp_path: Path) -> None:
    """The harness itself: a request and a console error are caught, and the request goes nowhere."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="http://192.0.2.1/x.png"><script>console.error("boom")</script>'
                    '<svg id="timeline" data-label-width="0"></svg></body></html>')
    seen, events = _open(browser, page, "")
    errors, requests = _problems(page, events)
    assert requests == ["http://192.0.2.1/x.png"] and seen["resources"] == 1 and any("boom" in e for e in errors)
    failed = [e["params"]["errorText"] for e in events if e["method"] == "Network.loadingFailed"]
    assert failed, "the request must fail: the browser has no network"


def _report(directory: Path) -> Path:
    assert main(["report", str(directory)]) == 0
    return directory / "report.html"


def test_cpu_job_report_draws_process_thread_source_rows_offline_and_unclipped(browser: Chromium,
                                                                              tmp_path: Path) -> None:
    cpu_job.write_job(tmp_path)
    page = _report(tmp_path)
    seen, events = _open(browser, page, "report-cpu-job.png")
    errors, requests = _problems(page, events)
    assert errors == [] and requests == [] and seen["resources"] == 0
    lane = f"{cpu_job.HOST} / {cpu_job.EXE} {cpu_job.PID}"
    assert seen["lanes"] == [lane]
    assert seen["rows"] == ["main thread \u00b7 Python", "main thread \u00b7 torch ops",
                            f"thread {cpu_job.SIDE_TID} \u00b7 Python", f"thread {cpu_job.SIDE_TID} \u00b7 torch ops"]
    assert seen["brackets"] == 1  # the process's lifetime: a bracket in the lane's header, not a bar
    assert seen["bars"] == cpu_job.Job(tmp_path, 0).spans - 1
    assert "0 s" in seen["ticks"] and "12 s" in seen["ticks"] and not any("\u00b5s" in t for t in seen["ticks"])
    assert seen["sections"] == ["PyTorch metrics", "Process metrics (per traced process)",
                                "Host metrics (system-wide)"]
    assert (seen["charts"], seen["value_tables"]) == (3, 1)  # pytorch.op.duration was read twice: values
    assert seen["cards"]["time span (first span to last)"][0] == "12.80 s"
    assert seen["cards"]["events lost"] == ["0", "card"]
    assert seen["cards"]["not recorded by a limit (not lost)"][0] == str(cpu_job.DEEP_PYTHON + cpu_job.DEEP_TORCH)
    assert seen["clipped"] == []


def test_nccl_job_report_draws_ranks_collectives_and_the_straggler_offline_and_unclipped(browser: Chromium,
                                                                                        tmp_path: Path) -> None:
    otlp_job.write_job(tmp_path)
    page = _report(tmp_path)
    seen, events = _open(browser, page, "report-nccl-job.png")
    errors, requests = _problems(page, events)
    assert errors == [] and requests == [] and seen["resources"] == 0
    ranks = [f"{otlp_job.host(r)} / rank {r} / python3 {1000 + r}" for r in range(otlp_job.RANKS)]
    assert seen["lanes"] == ["collectives (joined)", *ranks]
    assert (seen["straggler_lanes"], seen["straggler_notes"]) == ([ranks[otlp_job.STRAGGLER]], 1)
    assert seen["rows"] == [row for r in range(otlp_job.RANKS)
                            for row in (f"thread {2000 + r} \u00b7 CUDA", f"thread {2000 + r} \u00b7 NCCL")]
    assert seen["sections"] == ["GPU / CUDA / NCCL metrics"]
    assert seen["cards"]["events lost"] == [str(otlp_job.DROPPED), "card bad"]
    assert "not recorded by a limit (not lost)" not in seen["cards"]
    assert seen["clipped"] == []
