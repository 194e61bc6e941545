"""otel_ebpf/processors/lifecycle: fork/exec/exit -> one span per process, its argv redacted."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.host.processes import redact_command_line
from otel_ebpf.processors import sched
from otel_ebpf.processors.lifecycle import Config, LifecycleProcessor, factory
from otel_ebpf.processors.lifecycle.processor import redact_argv
from otel_ebpf.receivers.lifecycle.events import LifecycleExec, LifecycleExitCode, LifecycleFork

T = 1_700_000_000_000_000_000
SECRET_ARGV = ("python3", "train.py", "--password=hunter2pw", "--api-key", "k3ysekret",
               "https://user:pa55w0rdurl@host/x", "AWS_SECRET_ACCESS_KEY=awsargs3cr3t", "--token", "tok3nvalue")
SECRETS = ("hunter2pw", "k3ysekret", "pa55w0rdurl", "awsargs3cr3t", "tok3nvalue")


def make(**cfg: object) -> tuple[LifecycleProcessor, ListConsumer, Context]:
    sink, ctx = ListConsumer(), Context()
    return LifecycleProcessor(Config(**cfg), ctx, sink), sink, ctx  # type: ignore[arg-type]


def spans(events: list[object]) -> list[SpanRecord]:
    return [e for e in events if isinstance(e, SpanRecord)]


def test_fork_exec_exit_is_one_span_with_the_command_line_and_exit_code() -> None:
    proc, sink, _ = make()
    exit_ = ProcessExit(11, T + 3_000_000, "true", -1, source="lifecycle")
    proc.consume([LifecycleFork(11, 10, T, "sh"),
                  LifecycleExec(11, 11, T + 1_000_000, "/bin/true", ("/bin/true", "x y"), False),
                  LifecycleExitCode(11, T + 2_900_000, 4), exit_])
    out = sink.take()
    (span,) = spans(out)
    assert out[-1] is exit_  # the exit passes on
    assert (span.pid, span.name, span.start_ns, span.end_ns) == (11, "process true", T, T + 3_000_000)
    assert span.scope == "otel_ebpf.lifecycle"
    a = span.attributes
    assert a["process.pid"] == 11 and a["process.parent_pid"] == 10 and a["process.args_count"] == 2
    assert a["process.command_args"] == ("/bin/true", "x y") and a["process.command_line"] == "/bin/true x y"
    assert a["process.executable.path"] == "/bin/true" and a["process.executable.name"] == "true"
    assert a["process.exit.code"] == 4 and span.error == "exit code 4"
    (ev,) = span.events
    assert ev.name == "process.exec" and ev.time_ns == T + 1_000_000
    assert ev.attributes == {"process.executable.path": "/bin/true", "process.command_args": ("/bin/true", "x y"),
                             "thread.id": 11}
    assert proc.live_processes == 0


def test_forked_child_inherits_parent_command_line_and_other_sources_exits_are_ignored() -> None:
    proc, sink, _ = make()
    proc.consume([LifecycleExec(10, 10, T, "/usr/bin/python3", ("python3", "train.py"), True),
                  LifecycleFork(12, 10, T + 5, "python3"),
                  ProcessExit(12, T + 9, "python3", -1, source="cuda"),
                  ProcessExit(12, T + 9, "python3", -1, source="sched"),
                  LifecycleExitCode(12, T + 9, 0), ProcessExit(12, T + 10, "python3", -1, source="lifecycle")])
    (span,) = spans(sink.take())
    assert span.pid == 12 and span.attributes["process.command_args"] == ("python3", "train.py")
    assert span.attributes["process.lifecycle.args.truncated"] is True and span.error is None
    assert span.attributes["process.exit.code"] == 0 and span.end_ns == T + 10


def test_secrets_in_argv_never_reach_the_span_or_its_exec_events() -> None:
    """Issue 18: an earlier lifecycle split exported the kernel's argv unredacted. Both the span
    attributes and each process.exec event go through the resource's redaction; a child that
    inherits its parent's command line inherits the redacted one."""
    proc, sink, _ = make()
    proc.consume([LifecycleExec(20, 20, T, "/usr/bin/python3", SECRET_ARGV, False),
                  LifecycleFork(21, 20, T + 1, "python3"),
                  ProcessExit(21, T + 2, "python3", -1, source="lifecycle"),
                  ProcessExit(20, T + 3, "python3", -1, source="lifecycle")])
    out = spans(sink.take())
    assert len(out) == 2
    expected = tuple(redact_command_line(list(SECRET_ARGV)))  # what process.command_line on the resource gets
    for span in out:
        assert span.attributes["process.command_args"] == expected
        assert span.attributes["process.command_line"] == " ".join(expected)
    text = repr([(s.attributes, [e.attributes for e in s.events]) for s in out])
    assert "<redacted>" in text
    assert not [s for s in SECRETS if s in text], text


def test_redact_argv_matches_the_resource_and_also_splits_scripts() -> None:
    assert redact_argv(["tool", "--token", "abc", "--tokenizer", "gpt2"]) == (
        "tool", "--token", "<redacted>", "--tokenizer", "gpt2")
    # control characters go before redaction (a hidden \x01 must not split a secret key)
    assert redact_argv(["--pass\x01word=x1"]) == ("--password=<redacted>",)
    # one argument holding a command line (sh -c): word by word
    assert redact_argv(["sh", "-c", "curl -u a https://u:pw9@h/ --api-key k9 && echo ok"]) == (
        "sh", "-c", "curl -u a https://u:<redacted>@h/ --api-key <redacted> && echo ok")
    assert redact_argv(["x" * 300]) == ("x" * 256,)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=30))
def test_redact_argv_takes_any_argv(argv: list[str]) -> None:
    """The kernel's argv is whatever the traced process passed: any text is redacted without raising,
    one argument out per argument in, none longer than 256 characters, no control characters."""
    out = redact_argv(argv)
    assert len(out) == len(argv) and all(len(a) <= 256 for a in out)
    assert not any(ch in a for a in out for ch in "\x00\x01\n\x1b")


def test_running_processes_end_at_shutdown_twice_safe() -> None:
    proc, sink, _ = make()
    proc.consume([LifecycleFork(12, 10, T, "sh")])
    proc.shutdown()
    proc.shutdown()
    (span,) = spans(sink.take())
    assert span.attributes["process.lifecycle.running"] is True and span.end_ns >= span.start_ns


def test_process_table_is_bounded_and_counts_drops() -> None:
    proc, sink, ctx = make(max_processes=2, max_execs=1)
    proc.consume([LifecycleFork(p, 1, T, "sh") for p in (20, 21, 22)])
    assert proc.live_processes == 2
    assert ctx.telemetry.get(DROPPED, receiver="lifecycle", reason="process_table_full") == 1
    proc.consume([LifecycleExec(22, 22, T + i, "/bin/sh", ("sh",), False) for i in range(3)]
                 + [ProcessExit(22, T + 9, "sh", -1, source="lifecycle")])
    (span,) = spans(sink.take())
    assert len(span.events) == 1 and span.attributes["process.lifecycle.execs.dropped"] == 2


def test_other_events_pass_unchanged_and_spans_can_be_turned_off() -> None:
    proc, sink, _ = make(process_spans=False)
    other = object()
    proc.consume([other, LifecycleFork(30, 1, T, "sh"), ProcessExit(30, T + 1, "sh", -1, source="lifecycle")])
    out = sink.take()
    assert out[0] is other and not spans(out)
    assert factory.type == "lifecycle" and factory.default_on


@pytest.mark.parametrize("key", ["process_spans", "max_processes", "max_execs"])
def test_keys_that_moved_from_sched_are_unknown_there(key: str) -> None:
    """An old config's processors.sched.<key> is refused, naming the key path (docs/receivers.md)."""
    build(Config, {key: Config().__getattribute__(key)}, "processors.lifecycle")  # where it lives now
    with pytest.raises(ConfigError, match=rf"processors\.sched\.{key}.*unknown key"):
        build(sched.Config, {key: Config().__getattribute__(key)}, "processors.sched")
