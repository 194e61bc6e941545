"""otel_ebpf/processors/sched: scheduler stats -> metrics; fork/exec/exit -> one span per process."""
from __future__ import annotations

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.sched import Config, SchedProcessor, factory
from otel_ebpf.processors.sched.processor import bucket_value
from otel_ebpf.receivers.sched.events import SchedCpuStats, SchedExec, SchedExitCode, SchedFork, SchedProcStats
from otel_ebpf.core.telemetry import DROPPED

T = 1_700_000_000_000_000_000


def make(**cfg) -> tuple[SchedProcessor, ListConsumer, Context]:
    sink, ctx = ListConsumer(), Context()
    return SchedProcessor(Config(**cfg), ctx, sink), sink, ctx


def metrics(events, name: str) -> list[MetricRecord]:
    return [e for e in events if isinstance(e, MetricRecord) and e.name == name]


def test_proc_stats_become_semconv_and_sched_metrics() -> None:
    proc, sink, _ = make()
    proc.consume([SchedProcStats(5, T, 2_000_000_000, (100, 0, 300, 0), 50, 7, 2, ((10, 3), (20, 1)))])
    out = sink.take()
    (cpu,) = metrics(out, "process.cpu.time")
    assert (cpu.pid, cpu.kind, cpu.unit, cpu.value) == (5, "counter", "s", 2.0)
    off = {m.attributes["process.sched.off_cpu.reason"]: m.value for m in metrics(out, "process.sched.off_cpu.time")}
    assert off == {"sleep": 100e-9, "lock": 300e-9}
    assert [m.value for m in metrics(out, "process.sched.runq.time")] == [50e-9]
    cs = {m.attributes["process.context_switch.type"]: m.value for m in metrics(out, "process.context_switches")}
    assert cs == {"voluntary": 7, "involuntary": 2}
    hist = {(m.value, m.count) for m in metrics(out, "process.sched.runq.latency")}
    assert hist == {(bucket_value(10), 3), (bucket_value(20), 1)}
    assert all(m.kind == "histogram" and m.unit == "s" for m in metrics(out, "process.sched.runq.latency"))
    assert 2 ** 10 <= bucket_value(10) * 1e9 < 2 ** 11


def test_cpu_stats_per_core() -> None:
    proc, sink, _ = make()
    proc.consume([SchedCpuStats(5, 1, T, 250_000_000), SchedCpuStats(5, 0, T, 0)])
    (m,) = metrics(sink.take(), "process.sched.cpu.time")
    assert (m.value, dict(m.attributes)) == (0.25, {"cpu.logical_number": 1})


def test_fork_exec_exit_is_one_span_with_the_command_line_and_exit_code() -> None:
    proc, sink, _ = make()
    exit_ = ProcessExit(11, T + 3_000_000, "true", -1, source="sched")
    proc.consume([SchedFork(11, 10, T, "sh"),
                  SchedExec(11, 11, T + 1_000_000, "/bin/true", ("/bin/true", "x y"), False),
                  SchedExitCode(11, T + 2_900_000, 4), exit_])
    out = sink.take()
    (span,) = [e for e in out if isinstance(e, SpanRecord)]
    assert out[-1] is exit_  # the exit passes on
    assert (span.pid, span.name, span.start_ns, span.end_ns) == (11, "process true", T, T + 3_000_000)
    a = span.attributes
    assert a["process.pid"] == 11 and a["process.parent_pid"] == 10
    assert a["process.command_args"] == ("/bin/true", "x y") and a["process.command_line"] == "/bin/true x y"
    assert a["process.executable.path"] == "/bin/true" and a["process.exit.code"] == 4
    assert span.error == "exit code 4"
    assert [e.name for e in span.events] == ["process.exec"]
    assert proc.live_processes == 0


def test_forked_child_inherits_parent_command_line_and_other_sources_exits_are_ignored() -> None:
    proc, sink, _ = make()
    proc.consume([SchedExec(10, 10, T, "/usr/bin/python3", ("python3", "train.py"), True),
                  SchedFork(12, 10, T + 5, "python3"),
                  ProcessExit(12, T + 9, "python3", -1, source="cuda"),
                  SchedExitCode(12, T + 9, 0), ProcessExit(12, T + 10, "python3", -1, source="sched")])
    (span,) = [e for e in sink.take() if isinstance(e, SpanRecord)]
    assert span.pid == 12 and span.attributes["process.command_args"] == ("python3", "train.py")
    assert span.attributes["process.sched.args.truncated"] is True and span.error is None
    assert span.attributes["process.exit.code"] == 0


def test_running_processes_end_at_shutdown_twice_safe() -> None:
    proc, sink, _ = make()
    proc.consume([SchedFork(12, 10, T, "sh")])
    proc.shutdown()
    proc.shutdown()
    (span,) = [e for e in sink.take() if isinstance(e, SpanRecord)]
    assert span.attributes["process.sched.running"] is True and span.end_ns >= span.start_ns


def test_process_table_is_bounded_and_counts_drops() -> None:
    proc, sink, ctx = make(max_processes=2, max_execs=1)
    proc.consume([SchedFork(p, 1, T, "sh") for p in (20, 21, 22)])
    assert proc.live_processes == 2
    assert ctx.telemetry.get(DROPPED, receiver="sched", reason="process_table_full") == 1
    proc.consume([SchedExec(22, 22, T + i, "/bin/sh", ("sh",), False) for i in range(3)]
                 + [ProcessExit(22, T + 9, "sh", -1, source="sched")])
    (span,) = [e for e in sink.take() if isinstance(e, SpanRecord)]
    assert len(span.events) == 1 and span.attributes["process.sched.execs.dropped"] == 2


def test_other_events_pass_unchanged_and_spans_can_be_turned_off() -> None:
    proc, sink, _ = make(process_spans=False)
    other = object()
    proc.consume([other, SchedFork(30, 1, T, "sh"), ProcessExit(30, T + 1, "sh", -1, source="sched")])
    out = sink.take()
    assert out[0] is other and not [e for e in out if isinstance(e, SpanRecord)]
    assert factory.type == "sched"
