"""User-declared probes on real processes: a uprobe+uretprobe span with typed arguments on a
C program built here (tests/bpf/user_probes_target.c), a tracepoint with fields, a USDT probe
of /usr/bin/python3.11, and bad entries rejected with the exact key path before loading.
Every wait is bounded."""
from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.demo.build import compile_c
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.probes import Config as ProcessorConfig
from otel_ebpf.processors.probes import UserProbesProcessor
from otel_ebpf.receivers.probes import Config, create
from otel_ebpf.receivers.probes.events import ProbeHit

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
PATH = "receivers.probes"
PYTHON = "/usr/bin/python3.11"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("user_probes") / "user_probes_target"
    return compile_c(HERE / "user_probes_target.c", out, (), ())


def _cfg(probes: list[dict[str, Any]]) -> Config:
    return build(Config, {"probes": probes}, PATH)


def _wait_exit(sink: ListConsumer, pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(isinstance(e, ProcessExit) and e.pid == pid for e in sink.events):
        assert time.monotonic() < deadline, f"no ProcessExit of {pid} within {timeout}s"
        time.sleep(0.02)


@contextlib.contextmanager
def _traced(argv: list[str], config: Config) -> Iterator[tuple[subprocess.Popen[str], ListConsumer, Context]]:
    """Start argv (held until a line on stdin), attach, yield; the caller releases it."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    receiver = None
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, f"{argv[0]} never printed 'ready'"
        assert proc.stdout.readline().startswith("ready pid=")
        ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
        receiver = create(config, ctx, sink)
        receiver.start()
        yield proc, sink, ctx
    finally:
        if receiver is not None:
            receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _release(proc: subprocess.Popen[str], sink: ListConsumer) -> str:
    out, _ = proc.communicate("go\n", timeout=30)
    _wait_exit(sink, proc.pid)
    return out


def test_uprobe_span_with_typed_arguments_and_durations(bpf_ready: None, target: Path) -> None:
    lib = str(target)
    config = _cfg([
        {"name": "process_batch", "kind": "uprobe", "library": lib, "symbol": "process_batch", "span": True,
         "metric": "histogram",
         "args": [{"name": "batch_size", "type": "s32", "index": 0},
                  {"name": "model", "type": "str[64]", "index": 1},
                  {"name": "rc", "type": "s32", "retval": True}]},
        {"name": "batch_short", "kind": "uprobe", "library": lib, "symbol": "process_batch",
         "args": [{"name": "model", "type": "str[16]", "index": 1}, {"name": "size", "type": "u32", "index": 0}]},
    ])
    with _traced([lib], config) as (proc, sink, ctx):
        out = _release(proc, sink)
    assert out.split() == ["process_batch", "rc=17", "process_batch", "rc=65", "process_batch", "rc=-5"]
    hits = [e for e in sink.events if isinstance(e, ProbeHit)]
    spans = [h for h in hits if h.probe == "process_batch"]
    assert [dict(h.args) for h in spans] == [
        {"batch_size": 8, "model": "resnet50", "rc": 17},
        {"batch_size": 32, "model": "bert-large-uncased", "rc": 65},
        {"batch_size": -3, "model": "a-model-name-longer-than-sixteen-bytes", "rc": -5}]
    # busy_ms(size / 4 + 2) inside each call: 4, 10 and 2 ms at least
    for h, min_ms in zip(spans, (4, 10, 2), strict=True):
        assert h.span and h.pid == proc.pid and h.tid == proc.pid
        assert min_ms * 1e6 <= h.end_ns - h.start_ns < 2e9, h
    short = [dict(h.args) for h in hits if h.probe == "batch_short"]
    # str[16]: 15 bytes and the NUL; u32 of -3 is its two's complement
    assert short == [{"model": "resnet50", "size": 8}, {"model": "bert-large-uncased"[:15], "size": 32},
                     {"model": "a-model-name-lo", "size": 2**32 - 3}]
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="probes") == 0

    records = ListConsumer()
    UserProbesProcessor(ProcessorConfig(), ctx, records).consume(hits)
    span_recs = [r for r in records.events if isinstance(r, SpanRecord)]
    assert [(s.name, s.attributes["probe.arg.batch_size"], s.attributes["probe.arg.model"]) for s in span_recs] == [
        ("process_batch", 8, "resnet50"), ("process_batch", 32, "bert-large-uncased"),
        ("process_batch", -3, "a-model-name-longer-than-sixteen-bytes")]
    hist = [m for m in records.events if isinstance(m, MetricRecord) and m.name == "process_batch"]
    assert [m.kind for m in hist] == ["histogram"] * 3 and hist[1].unit == "s" and hist[1].value >= 0.010
    counts = [m for m in records.events if isinstance(m, MetricRecord) and m.name == "batch_short"]
    assert [(m.kind, m.value) for m in counts] == [("counter", 1)] * 3


def test_tracepoint_fields_counted(bpf_ready: None, target: Path) -> None:
    config = _cfg([{"name": "openat", "kind": "tracepoint", "tracepoint": "syscalls:sys_enter_openat",
                    "args": [{"name": "dfd", "type": "s32", "field": "dfd"},
                             {"name": "filename", "type": "str[32]", "field": "filename"}]}])
    with _traced([str(target), "--open"], config) as (proc, sink, ctx):
        _release(proc, sink)
    hits = [e for e in sink.events if isinstance(e, ProbeHit) and dict(e.args)["filename"] == "/dev/null"]
    assert len(hits) == 5  # the program opens /dev/null 5 times with openat(AT_FDCWD, ...)
    assert {dict(h.args)["dfd"] for h in hits} == {-100}  # AT_FDCWD
    records = ListConsumer()
    UserProbesProcessor(ProcessorConfig(), ctx, records).consume(hits)
    assert sum(m.value for m in records.events if isinstance(m, MetricRecord) and m.name == "openat") == 5


def test_usdt_probe_of_python_with_semaphore(bpf_ready: None) -> None:
    config = _cfg([{"name": "gc_start", "kind": "usdt", "library": PYTHON, "provider": "python",
                    "probe": "gc__start", "args": [{"name": "generation", "type": "s32", "index": 0}]}])
    code = "import gc, sys\nprint('ready pid=0', flush=True)\nsys.stdin.readline()\nfor g in (0, 1, 2): gc.collect(g)\n"
    with _traced([PYTHON, "-c", code], config) as (proc, sink, _ctx):
        _release(proc, sink)
    gens = [dict(e.args)["generation"] for e in sink.events if isinstance(e, ProbeHit)]
    assert gens[:3] == [0, 1, 2], gens  # the interpreter's own collections at exit follow


@pytest.mark.parametrize(("entry", "key", "message"), [
    ({"name": "b", "kind": "uprobe", "library": "TARGET", "symbol": "no_such_function"},
     "probes[0].symbol", "symbol 'no_such_function' not found in TARGET"),
    ({"name": "b", "kind": "uprobe", "library": "/nonexistent/lib.so", "symbol": "f"},
     "probes[0].library", "/nonexistent/lib.so: no such file"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "syscalls:sys_enter_nothing"},
     "probes[0].tracepoint", "tracepoint syscalls:sys_enter_nothing does not exist here"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "syscalls:sys_enter_openat",
      "args": [{"name": "x", "type": "u32", "field": "fd"}]},
     "probes[0].args[0].field", "syscalls:sys_enter_openat has no field 'fd' (fields: __syscall_nr, dfd, "
                                "filename, flags, mode)"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "syscalls:sys_enter_openat",
      "args": [{"name": "x", "type": "str[8]", "field": "dfd"}]},
     "probes[0].args[0].type", "field dfd is 'int dfd', not a char * or char[N] string"),
    ({"name": "u", "kind": "usdt", "library": PYTHON, "provider": "python", "probe": "no_such_probe"},
     "probes[0].probe", f"{PYTHON} has no USDT probe python:no_such_probe"),
    ({"name": "u", "kind": "usdt", "library": PYTHON, "provider": "python", "probe": "gc__start",
      "args": [{"name": "x", "type": "s32", "index": 3}]},
     "probes[0].args[0].index", "python:gc__start in /usr/bin/python3.11 has 1 arguments, index 3 is out of range"),
])
def test_bad_entries_rejected_before_loading(bpf_ready: None, target: Path, entry: dict[str, Any], key: str,
                                             message: str) -> None:
    entry = {k: (str(target) if v == "TARGET" else v) for k, v in entry.items()}
    with pytest.raises(ConfigError) as err:
        _cfg([entry])
    assert err.value.path == f"{PATH}.{key}"
    assert message.replace("TARGET", str(target)) in str(err.value)


def test_empty_list_loads_nothing() -> None:
    receiver = create(_cfg([]), Context(), ListConsumer())
    receiver.start()
    assert receiver.bpf is None
    receiver.shutdown()
    receiver.shutdown()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
