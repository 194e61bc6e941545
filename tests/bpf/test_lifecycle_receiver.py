"""The lifecycle receiver's real tracepoints on processes the test starts.

Each test starts ``sh -c 'read go; SCRIPT'``, loads the receiver with that shell as the traced
root, then lets it go: everything the script forks and execs is traced from its first instruction.
Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.processors.lifecycle import Config as ProcessorConfig
from otel_ebpf.processors.lifecycle import LifecycleProcessor
from otel_ebpf.receivers.lifecycle import Config, LifecycleReceiver
from otel_ebpf.receivers.lifecycle.events import LifecycleExec, LifecycleExitCode, LifecycleFork

pytestmark = pytest.mark.bpf


@dataclass
class Run:
    child: subprocess.Popen[bytes]
    ctx: Context
    events: list[object]


@contextlib.contextmanager
def traced(script: str) -> Iterator[Run]:
    """The receiver tracing ``script`` (a shell command line) until it exits; its events are in
    ``run.events`` once the receiver has shut down."""
    child = subprocess.Popen(["/bin/sh", "-c", "read go; " + script], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx, sink = Context(target_pids=[child.pid]), ListConsumer()
    receiver = LifecycleReceiver(Config(), ctx, sink)
    run = Run(child, ctx, [])
    try:
        receiver.start()
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.close()
        yield run
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        receiver.shutdown()
        run.events = sink.take()


def _spans(ctx: Context, events: list[object]) -> dict[int, SpanRecord]:
    sink = ListConsumer()
    proc = LifecycleProcessor(ProcessorConfig(), ctx, sink)
    proc.consume(events)
    proc.shutdown()
    return {s.pid: s for s in sink.take() if isinstance(s, SpanRecord)}


def test_thirty_short_lived_processes_give_exec_fork_and_exit_code_each(bpf_ready: None) -> None:
    script = ("i=0; while [ $i -lt 30 ]; do /bin/true lc $i; i=$((i+1)); done; "
              "/bin/sh -c 'exit 3'; /nonexistent/lc_missing never; exit 0")
    with traced(script) as run:
        pass
    events, shell = run.events, run.child.pid
    execs = {int(e.argv[2]): e for e in events if isinstance(e, LifecycleExec) and e.filename == "/bin/true"}
    assert sorted(execs) == list(range(30))
    assert all(e.argv == ("/bin/true", "lc", str(i)) and not e.truncated for i, e in execs.items())
    pids = {e.pid for e in execs.values()}
    assert len(pids) == 30
    forks = {e.pid: e for e in events if isinstance(e, LifecycleFork) and e.ppid == shell}
    assert pids <= set(forks)
    codes = {e.pid: e.exit_code for e in events if isinstance(e, LifecycleExitCode)}
    assert all(codes.get(p) == 0 for p in pids), codes
    (failing,) = [e for e in events if isinstance(e, LifecycleExec) and e.argv == ("/bin/sh", "-c", "exit 3")]
    assert codes[failing.pid] == 3
    # the failed exec: its child was forked and exited 127, but it is not an exec
    assert not [e for e in events if isinstance(e, LifecycleExec) and "lc_missing" in e.filename]
    tried = set(forks) - pids - {failing.pid}
    assert [codes.get(p) for p in tried] == [127], (tried, codes)
    exits = {e.pid for e in events if isinstance(e, ProcessExit) and e.source == "lifecycle"}
    assert pids | {failing.pid, shell} <= exits
    assert run.ctx.telemetry.get(DROPPED, receiver="lifecycle") == 0
    # through the processor: one span per process, the non-zero exit an error
    spans = _spans(run.ctx, events)
    for pid in pids:
        s = spans[pid]
        assert s.name == "process true" and s.attributes["process.command_line"].startswith("/bin/true lc ")
        assert s.attributes["process.exit.code"] == 0 and s.error is None and s.end_ns > s.start_ns
        assert [ev.name for ev in s.events] == ["process.exec"]
    assert spans[failing.pid].error == "exit code 3"
    (missing,) = tried
    assert spans[missing].attributes["process.exit.code"] == 127 and not spans[missing].events


def test_execveat_is_an_exec_too(bpf_ready: None) -> None:
    """fexecve() (glibc >= 2.34: execveat(fd, "", argv, envp, AT_EMPTY_PATH)) is seen, with argv."""
    code = "import os; fd = os.open('/bin/true', os.O_RDONLY); os.execve(fd, ['true', 'via-fd'], {})"
    with traced(f"{sys.executable} -c \"{code}\"") as run:
        pass
    (ev,) = [e for e in run.events if isinstance(e, LifecycleExec) and e.argv == ("true", "via-fd")]
    assert ev.filename == ""  # AT_EMPTY_PATH: the file is the descriptor
    assert {e.pid for e in run.events if isinstance(e, LifecycleExitCode) and e.exit_code == 0} >= {ev.pid}


def test_long_argument_lists_are_cut_and_marked_truncated(bpf_ready: None) -> None:
    """At most LC_MAX_ARGS (24) arguments of at most LC_ARG_MAX (256) bytes each, LC_ARGS_LEN (1024) in all;
    whatever is cut is marked truncated, and what fits is exact."""
    many = " ".join(f"a{i}" for i in range(30))
    long_arg = "L" * 300
    five = " ".join(["B" * 250] * 5)
    with traced(f"/bin/true {many}; /bin/true x {long_arg}; /bin/true {five}; /bin/true short") as run:
        pass
    execs = [e for e in run.events if isinstance(e, LifecycleExec) and e.filename == "/bin/true"]
    assert len(execs) == 4, execs
    assert execs[0].argv == ("/bin/true", *(f"a{i}" for i in range(23))) and execs[0].truncated
    assert execs[1].argv[:2] == ("/bin/true", "x") and execs[1].argv[2] == "L" * 255 and execs[1].truncated
    assert execs[2].truncated and len("\0".join(execs[2].argv)) <= 1024
    assert execs[2].argv[:4] == ("/bin/true", "B" * 250, "B" * 250, "B" * 250)
    assert execs[3].argv == ("/bin/true", "short") and not execs[3].truncated


def test_secrets_in_a_real_argv_are_redacted_on_the_span_and_the_exec_event(bpf_ready: None) -> None:
    """The receiver's events hold argv as the kernel read it; nothing the processor makes of them does."""
    secrets = "--password=hunter2pw --api-key k3ysekret https://u:pa55w0rd@h/x --token tok3n"
    with traced(f"/bin/sh -c '/bin/true {secrets}; exit 0'") as run:
        pass
    (ev,) = [e for e in run.events if isinstance(e, LifecycleExec) and e.filename == "/bin/true"]
    (script,) = [e for e in run.events if isinstance(e, LifecycleExec) and e.filename == "/bin/sh"]
    assert "hunter2pw" in ev.argv[1] and "hunter2pw" in script.argv[2]  # raw events: never exported as they are
    spans = _spans(run.ctx, run.events)
    span = spans[ev.pid]
    assert span.attributes["process.command_args"] == (
        "/bin/true", "--password=<redacted>", "--api-key", "<redacted>", "https://u:<redacted>@h/x",
        "--token", "<redacted>")
    # the shell's argument is the whole script: redacted word by word
    assert spans[script.pid].attributes["process.command_args"][2] == (
        "/bin/true --password=<redacted> --api-key <redacted> https://u:<redacted>@h/x --token <redacted> exit 0")
    for s in (span, spans[script.pid]):
        (exec_event,) = s.events
        for value in (s.attributes["process.command_line"], *s.attributes["process.command_args"],
                      *exec_event.attributes["process.command_args"]):
            assert not any(x in value for x in ("hunter2pw", "k3ysekret", "pa55w0rd", "tok3n")), value


def test_exec_storm_of_1000_short_lived_processes_is_seen_completely(bpf_ready: None) -> None:
    n = 1000
    with traced(f"i=0; while [ $i -lt {n} ]; do /bin/true storm $i; i=$((i+1)); done") as run:
        pass
    events = run.events
    execs = {int(e.argv[2]): e for e in events if isinstance(e, LifecycleExec) and e.filename == "/bin/true"}
    assert sorted(execs) == list(range(n))
    assert all(e.argv[:2] == ("/bin/true", "storm") for e in execs.values())
    pids = {e.pid for e in execs.values()}
    assert len(pids) == n
    assert pids <= {e.pid for e in events if isinstance(e, LifecycleFork) and e.ppid == run.child.pid}
    assert {e.pid for e in events if isinstance(e, LifecycleExitCode) and e.exit_code == 0} >= pids
    assert {e.pid for e in events if isinstance(e, ProcessExit) and e.source == "lifecycle"} >= pids
    assert run.ctx.telemetry.get(DROPPED, receiver="lifecycle") == 0
    spans = _spans(run.ctx, events)
    assert all(spans[p].attributes["process.command_line"].startswith("/bin/true storm ") for p in pids)
    assert not [s for s in spans.values() if "process.lifecycle.running" in s.attributes]
