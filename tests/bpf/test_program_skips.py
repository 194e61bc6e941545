"""A run of a receiver's program that the kernel skipped is counted: ``otel_ebpf.bpf.runs_skipped{receiver,program}``
from the program's own ``recursion_misses`` (otel_ebpf.bpf.skips).

The kernel skips a raw-tracepoint program that would run inside itself (``__bpf_trace_run``: ``prog->active``), and
a perf-attached one on a CPU where a BPF program already runs (``trace_call_bpf``: ``bpf_prog_active``; a nested
perf tracepoint of the same context is dropped by perf before that, uncounted). The test's receiver makes the first
happen on purpose: its program on ``sys_enter_getppid`` calls ``bpf_trace_printk``; its raw-tracepoint program on
``bpf_trace_printk`` runs for that line and writes one of its own, whose event would run it again inside itself:
that run is skipped, once a call. No real caller needed: the programs are the test's own, and what is under test is the
base receiver's reading of the kernel's count.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_ebpf.bpf.receiver import RUNS_SKIPPED, BpfReceiver
from otel_ebpf.core.pipeline import Context, ListConsumer

pytestmark = pytest.mark.bpf

PROGRAM = """
TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
    if ((bpf_get_current_pid_tgid() >> 32) != SKIP_TGID)
        return 0;
    bpf_trace_printk("otel-ebpf test_program_skips: outer\\n");
    return 0;
}

/* runs for the outer program's line; its own line fires the same tracepoint inside it: that nested run is skipped */
RAW_TRACEPOINT_PROBE(bpf_trace_printk)
{
    if ((bpf_get_current_pid_tgid() >> 32) != SKIP_TGID)
        return 0;
    bpf_trace_printk("otel-ebpf test_program_skips: inner\\n");
    return 0;
}
"""
CALLS = 50


def test_a_program_the_kernel_skips_is_counted_by_receiver_and_program(bpf_ready: None, tmp_path: Path) -> None:
    src = tmp_path / "skips.bpf.c"
    src.write_text(PROGRAM)

    class Nested(BpfReceiver):
        name = "skiptest"
        src_file = src

        def cflags(self) -> list[str]:
            return [f"-DSKIP_TGID={os.getpid()}"]

    ctx = Context()
    receiver = Nested(ctx, ListConsumer(), ringbuf_pages=1)
    receiver.start()
    try:
        for _ in range(CALLS):
            os.getppid()
    finally:
        receiver.shutdown()  # the final drain reads the counters
    skipped = ctx.telemetry.get(RUNS_SKIPPED, receiver="skiptest", program="raw_tracepoint__bpf_trace_printk")
    assert skipped == CALLS, ctx.telemetry.snapshot()
    # the outer program ran every time and was never skipped
    assert ctx.telemetry.get(RUNS_SKIPPED, program="tracepoint__syscalls__sys_enter_getppid") == 0
