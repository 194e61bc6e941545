"""The eACGM-style pipeline, rebuilt faithfully so ``bench/run.py`` can compare against it.

eACGM (../shared/seeds, "eBPFSampler") attaches one BPF function per probe that calls
``bpf_trace_printk("%ld start <name>\\n", ts)`` on entry and ``"%ld end <name>"`` on return,
and its sampler reads the kernel's trace_pipe line by line, parses each line into a sample
(task, pid, cpu, timestamp, message) and pairs start/end into calls. As eACGM's
``eBPFSampler.sample(time_stamp)`` does, the reader spins on non-blocking ``trace_fields`` for
``time_stamp`` (1 s, its example's value) and then hands the samples on; it never sleeps.
(Session 2's rebuild slept 1 ms after each empty read; trace_pipe read non-blocking yields about
one line per read here, so that reader drained ~900 lines/s and its figures were far below what
eACGM does. Corrected in session 3.) Here the paired calls go
to the same place as ours (``otel_ebpf.emit.Emitter`` -> the SDK -> the OTLP JSON lines file
exporter), so the comparison measures only what differs: printk + trace_pipe parsing versus
in-kernel pairing + a binary ring buffer (+ in-kernel aggregation for launches).

trace_pipe has no drop counter a reader can see: when its per-CPU buffer is full, lines are
lost silently. Loss is measured here as calls made minus spans exported.

The trace buffer is set to the kernel's default expanded size (1408 KiB per CPU) for the run:
this VM boots with it unexpanded (7 KiB), which would make the comparison unfair to eACGM.
"""
from __future__ import annotations

import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

__all__ = ["EacgmStylePipeline"]

_BUFFER = Path("/sys/kernel/tracing/buffer_size_kb")
_TRACE = Path("/sys/kernel/tracing/trace")  # writing it empties the buffer trace_pipe reads
_DEFAULT_KB = 1408

_SRC = """
#include <uapi/linux/ptrace.h>
int memcpy_entry(struct pt_regs *ctx) {
    u64 ts = bpf_ktime_get_ns();
    bpf_trace_printk("%ld start cudaMemcpy\\n", ts);
    return 0;
}
int memcpy_exit(struct pt_regs *ctx) {
    u64 ts = bpf_ktime_get_ns();
    bpf_trace_printk("%ld end cudaMemcpy\\n", ts);
    return 0;
}
int launch_entry(struct pt_regs *ctx) {
    u64 ts = bpf_ktime_get_ns();
    bpf_trace_printk("%ld start cudaLaunchKernel\\n", ts);
    return 0;
}
int launch_exit(struct pt_regs *ctx) {
    u64 ts = bpf_ktime_get_ns();
    bpf_trace_printk("%ld end cudaLaunchKernel\\n", ts);
    return 0;
}
"""


class EacgmStylePipeline:
    """printk probes on ``symbol`` of ``library`` -> trace_pipe -> parse -> pair -> Emitter.

    ``start()`` attaches and starts the reader thread; ``stop()`` reads until trace_pipe has
    been quiet for ``quiet_s``, exports everything and returns the number of spans exported.
    """

    def __init__(self, library: str, symbol: str, out_dir: str | None = None, pid: int | None = None) -> None:
        from bcc import BPF

        from otel_ebpf.bpf.clock import KernelClock
        from otel_ebpf.emit.emitter import Emitter, ExporterSpec
        from otel_ebpf.emit.jsonfile import JsonLinesMetricExporter, JsonLinesSpanExporter
        from otel_ebpf.host.identity import agent_resource_attributes
        from otel_ebpf.host.processes import ResourceCache
        from otel_ebpf.core.telemetry import Telemetry

        self._saved_kb = _BUFFER.read_text().split()[0]
        if int(self._saved_kb) < _DEFAULT_KB:
            _BUFFER.write_text(str(_DEFAULT_KB))
        _TRACE.write_text("")  # lines an earlier reader left unread must not count for this run
        self.pid = pid  # count only this process's spans (None: all)
        self.spans_of_pid = 0
        self._tmp = None if out_dir else tempfile.TemporaryDirectory()
        d = out_dir or self._tmp.name  # type: ignore[union-attr]
        fn = "memcpy" if symbol == "cudaMemcpy" else "launch"
        self.bpf = BPF(text=_SRC)
        self.bpf.attach_uprobe(name=library, sym=symbol, fn_name=f"{fn}_entry")
        self.bpf.attach_uretprobe(name=library, sym=symbol, fn_name=f"{fn}_exit")
        cache = ResourceCache()
        self.telemetry = Telemetry()  # the emitter's drops (export queue full, export failed)
        self.emitter = Emitter([ExporterSpec("file", JsonLinesSpanExporter(Path(d)),
                                             JsonLinesMetricExporter(Path(d)))], self.telemetry,
                               resource_of=lambda pid, comm: cache.get(pid, comm),
                               agent_attributes=agent_resource_attributes())
        self.clock = KernelClock()
        self.lines = 0
        self.unparsed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last_line = time.monotonic()

    def start(self) -> None:
        self.emitter.start()
        self._thread.start()

    def _run(self, time_stamp: float = 1.0) -> None:
        from otel_ebpf.core.events import SpanRecord

        open_calls: dict[tuple[int, str], int] = defaultdict(int)
        batch: list[SpanRecord] = []
        handed = time.monotonic()
        while not self._stop.is_set():
            if batch and time.monotonic() - handed >= time_stamp:  # the end of one sample() call
                self.emitter.consume(batch)
                batch, handed = [], time.monotonic()
            fields = self.bpf.trace_fields(nonblocking=True)
            if fields is None or fields[0] is None:
                continue  # eACGM's sample(): spin until its time_stamp is over
            self._last_line = time.monotonic()
            self.lines += 1
            _task, pid, _cpu, _flags, _ts, msg = fields
            try:  # eACGM's sample: "<ts> start|end <name>"
                ts_s, what, name = msg.decode().split()
                ts = int(ts_s)
            except ValueError:
                self.unparsed += 1
                continue
            key = (int(pid), name)
            if what == "start":
                open_calls[key] = ts
            elif key in open_calls:
                start = open_calls.pop(key)
                if self.pid is None or int(pid) == self.pid:
                    self.spans_of_pid += 1
                batch.append(SpanRecord(pid=int(pid), name=name, start_ns=self.clock.to_epoch_ns(start),
                                        end_ns=self.clock.to_epoch_ns(ts), attributes={"cuda.api": name}))
        if batch:
            self.emitter.consume(batch)

    def stop(self, quiet_s: float = 1.0, timeout_s: float = 60.0) -> int:
        """Drain trace_pipe until quiet, detach, export; returns the spans exported of ``pid``
        (all of them when it is None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() - self._last_line < quiet_s and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=10)
        self.bpf.cleanup()
        _BUFFER.write_text(self._saved_kb)
        self.emitter.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()
        lost = self.telemetry.get("otel_ebpf.events.dropped")  # handed on but never exported
        return max(0, (self.spans_of_pid if self.pid is not None else self.emitter.spans_emitted) - lost)
