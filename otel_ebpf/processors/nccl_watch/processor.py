"""nccl_watch: the live stack of a rank that stopped making NCCL calls, as OTel log records (issue 17).

Sits after the ``nccl`` processor and passes every event on unchanged. From the NCCL call spans that
pass (``nccl<Op>`` with ``nccl.comm.id``; not the root, GPU, group, simulated or CUDA-graph-captured
ones) it keeps, per process, each communicator's last call (end time, ``nccl.seq``, ``nccl.op``,
rank, size) and the longest recent gap between two calls (:mod:`.ranks`; thresholds in
:class:`~.config.Config`). On each ``Tick`` (the agent sends one every second while nothing else
flows), a process silent past its threshold whose /proc entry still lives is queued for a stack
capture (:mod:`otel_ebpf.host.stacks`, py-spy) on the capture thread (:mod:`.worker`), never on the
pipeline worker. Finished captures go out with the next batch (a tick at the latest) as one
:class:`~otel_ebpf.core.events.LogRecord` per communicator of that process, all sharing the capture:
the contract is :mod:`otel_ebpf.core.rankstack` (event ``otel_ebpf.nccl.rank.stack``, severity WARN).
Every rank of a hung job goes silent, so the ranks waiting in a collective are captured too and the
one that is elsewhere stands out. An exited process is not captured and its capture gives no record.

Bounds, all counted: captures per process (``min_interval``, doubling while one silence lasts, up to
``max_interval``), stack bytes per minute (token bucket), queue (``max_queue``), processes and
communicators remembered.

Metrics (scope ``otel_ebpf.nccl_watch``, the agent's resource): ``otel_ebpf.nccl.stack.captures``
{otel_ebpf.stack.outcome} (exited included), ``otel_ebpf.nccl.stack.suppressed`` {reason: rate_limit,
byte_budget}, ``otel_ebpf.nccl.stack.bytes`` (bodies exported). Drops: ``otel_ebpf.events.dropped``
{receiver=nccl_watch, reason=capture_queue_full | rank_table_full | comm_table_full | shutdown}.

Threading: ``consume`` runs on the pipeline worker and never raises nor blocks on a capture.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from otel_ebpf.core.events import AttrValue, LogRecord, ProcessExit, SpanRecord, Tick
from otel_ebpf.core.ids import collective_ids
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles
from otel_ebpf.core.rankstack import RANK_STACK_EVENT
from otel_ebpf.host import stacks
from otel_ebpf.host.procfs import process_gone

from .config import Config
from .ranks import CommState, Due, RankTable
from .worker import CaptureWorker

__all__ = ["METRICS", "SCOPE", "NcclWatchProcessor"]

log = logging.getLogger(__name__)
SCOPE = "otel_ebpf.nccl_watch"
METRICS: dict[str, MetricSpec] = {
    "otel_ebpf.nccl.stack.captures": ("counter", "{capture}", "Stack captures of silent NCCL ranks, by outcome."),
    "otel_ebpf.nccl.stack.suppressed": ("counter", "{capture}",
                                        "Captures of silent ranks not made: rate limit or byte budget."),
    "otel_ebpf.nccl.stack.bytes": ("counter", "By", "Stack text exported in log records (each record counted)."),
}
Capture = Callable[[int], stacks.StackCapture]


class NcclWatchProcessor(EventProcessor[Config]):
    """Processor ``nccl_watch``. ``capture(pid)`` and ``gone(pid)`` are injectable (tests); by default
    :func:`otel_ebpf.host.stacks.capture` with the config's bounds and /proc."""

    NAME = "nccl_watch"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer, *, capture: Capture | None = None,
                 gone: Callable[[int], bool] = process_gone) -> None:
        super().__init__(config, ctx, next_)
        c = config
        self.table = RankTable(min_silence_s=c.min_silence, max_silence_s=c.max_silence, factor=c.silence_factor,
                               half_life_s=c.gap_half_life, max_processes=c.max_processes,
                               max_comms=c.max_comms_per_process)
        self._capture = capture or functools.partial(
            stacks.capture, native=c.native, timeout_s=c.capture_timeout, max_bytes=c.max_stack_bytes,
            max_frames=c.max_frames, max_threads=c.max_threads)
        self._gone = gone
        self.worker: CaptureWorker[Due, stacks.StackCapture] = CaptureWorker(self._run, c.max_queue,
                                                                             "otel-ebpf-nccl-watch")
        self._tick_ns = 0  # the batch's Tick time, 0: none in this batch
        self._tokens, self._tokens_ns = float(c.max_bytes_per_minute), 0
        self._warned: set[str] = set()

    def start(self) -> None:
        self.worker.start()

    def shutdown(self) -> None:
        """Waits for the running capture (capture_timeout + 1 s at most), hands on what finished, counts
        the captures that never ran (reason shutdown). Safe without start and twice."""
        never = self.worker.shutdown(self.config.capture_timeout + 1.0)
        if never:
            self._telemetry.dropped(self.NAME, "shutdown", len(never))
        out: list[object] = []
        self._finished(out)
        self.sums.flush(out)
        if out:
            self._next.consume(out)

    def _run(self, due: Due) -> stacks.StackCapture:
        """On the capture thread. Never raises: a capture function that raises is an ``error`` outcome."""
        try:
            return self._capture(due.pid)
        except Exception as exc:
            log.debug("nccl_watch: capture of pid %d raised", due.pid, exc_info=True)
            return stacks.StackCapture(due.pid, "error", f"the capture raised {type(exc).__name__}: {exc}")

    # ---- what passes -------------------------------------------------------------------------------
    @handles(SpanRecord)
    def _span(self, ev: SpanRecord, out: list[object]) -> None:
        out.append(ev)
        attrs = ev.attributes
        op, comm_id = attrs.get("nccl.op"), attrs.get("nccl.comm.id")
        if not isinstance(op, str) or not isinstance(comm_id, str) or ev.name != "nccl" + op:
            return  # not a call span (root "nccl <Op>", "<name> gpu", ncclGroup, lifecycle spans)
        if attrs.get("nccl.simulated"):
            return  # never ran
        if attrs.get("nccl.captured"):
            forgotten = self.table.graph_captured(ev.pid, comm_id)
        else:
            seq, rank, nranks = (attrs.get(k) for k in ("nccl.seq", "nccl.rank", "nccl.nranks"))
            forgotten = self.table.call(ev.pid, CommState(comm_id, ev.end_ns, op, _int(seq), _int(rank), _int(nranks)))
        for reason in forgotten:
            self._telemetry.dropped(self.NAME, reason)

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: list[object]) -> None:
        out.append(ev)
        self.table.forget(ev.pid)  # any receiver's exit: the process is gone, a capture would find nothing

    @handles(Tick)
    def _tick(self, ev: Tick, out: list[object]) -> None:
        out.append(ev)
        self._tick_ns = max(self._tick_ns, ev.time_ns)

    def end_batch(self, out: list[object]) -> None:
        self._finished(out)
        if self._tick_ns:
            now, self._tick_ns = self._tick_ns, 0
            self._check(now)
        super().end_batch(out)

    # ---- silence -> captures -----------------------------------------------------------------------
    def _check(self, now_ns: int) -> None:
        """Queue a capture for each process silent past its threshold that may be captured now."""
        self._refill(now_ns)
        for rank, due in self.table.silent(now_ns):
            if now_ns < rank.next_ns:
                if not rank.episode and not rank.suppressed:  # a new silence too soon after the last capture
                    rank.suppressed = True
                    self.sums.add(None, "otel_ebpf.nccl.stack.suppressed", 1, {"reason": "rate_limit"})
                continue
            if self._gone(rank.pid):
                self.table.forget(rank.pid)
                continue
            retry = now_ns + int(self.config.min_interval * 1e9)
            if self._tokens <= 0:
                self.sums.add(None, "otel_ebpf.nccl.stack.suppressed", 1, {"reason": "byte_budget"})
                rank.next_ns = retry
                continue
            if not self.worker.submit(due):
                self._telemetry.dropped(self.NAME, "capture_queue_full")
                rank.next_ns = retry
                continue
            self._tokens -= self._reserve(due)  # its worst case now, settled when it is back (_records)
            rank.pending = True
            rank.episode += 1
            wait = min(self.config.max_interval, self.config.min_interval * 2 ** (rank.episode - 1))
            rank.next_ns = now_ns + int(wait * 1e9)

    def _reserve(self, due: Due) -> int:
        """The most bytes a capture of ``due`` can export: a full text (or message) per communicator."""
        return self.config.max_stack_bytes * len(due.comms)

    def _refill(self, now_ns: int) -> None:
        rate = self.config.max_bytes_per_minute / 60e9  # bytes per ns
        if self._tokens_ns:
            self._tokens = min(float(self.config.max_bytes_per_minute),
                               self._tokens + max(0, now_ns - self._tokens_ns) * rate)
        self._tokens_ns = now_ns

    def _finished(self, out: list[object]) -> None:
        """The captures finished since the last batch -> log records and counts."""
        for due, cap in self.worker.take():
            rank = self.table.ranks.get(due.pid)
            if rank is not None:
                rank.pending = False
            self.sums.add(None, "otel_ebpf.nccl.stack.captures", 1, {"otel_ebpf.stack.outcome": cap.outcome})
            if cap.outcome == "exited":
                self._tokens += self._reserve(due)
                self.table.forget(due.pid)
                continue
            self._warn_once(cap)
            self._records(due, cap, out)

    def _records(self, due: Due, cap: stacks.StackCapture, out: list[object]) -> None:
        body = cap.text or f"no stack: {cap.message}".encode()[:self.config.max_stack_bytes].decode("utf-8", "ignore")
        common: dict[str, AttrValue] = {
            "nccl.silence.threshold_ms": due.threshold_ns // 1_000_000, "otel_ebpf.stack.outcome": cap.outcome,
            "otel_ebpf.stack.threads": len(cap.threads) + cap.threads_dropped,
            "otel_ebpf.stack.truncated": cap.truncated, "otel_ebpf.stack.capture_ms": round(cap.duration_s * 1e3, 1)}
        frame = cap.innermost()
        if frame is not None:
            common.update({"code.function.name": frame.function, "code.file.path": frame.file})
            if frame.line:
                common["code.line.number"] = frame.line
        time_ns = time.time_ns()
        for comm in due.comms:
            attrs: dict[str, AttrValue] = {"nccl.comm.id": comm.comm_id, "nccl.op": comm.op,
                                           "nccl.silence_ms": max(0, due.now_ns - comm.end_ns) // 1_000_000}
            for key, value in (("nccl.rank", comm.rank), ("nccl.nranks", comm.nranks), ("nccl.seq", comm.seq)):
                if value is not None:
                    attrs[key] = value
            attrs.update(common)
            # the trace of the collective the rank is expected to join next on this comm (seq + 1): where the
            # record shows beside the hung collective, and what a Collector's loadbalancing exporter routes by, so
            # the record reaches the gateway holding that collective's desync (collective_join/hangs.py)
            trace = 0
            if comm.seq is not None and comm.op not in ("Send", "Recv"):
                trace = collective_ids(comm.comm_id, comm.seq + 1, 0)[0]
            out.append(LogRecord(due.pid, time_ns, RANK_STACK_EVENT, body, attrs, severity="WARN", scope=SCOPE,
                                 trace_id=trace))
        spent = len(body.encode()) * len(due.comms)
        self._tokens += self._reserve(due) - spent
        self.sums.add(None, "otel_ebpf.nccl.stack.bytes", spent, {})

    def _warn_once(self, cap: stacks.StackCapture) -> None:
        """One warning per failing outcome kind (permission, missing...): the records say it each time."""
        if cap.outcome in ("ok", "not_python", "busy") or cap.outcome in self._warned:
            return
        self._warned.add(cap.outcome)
        log.warning("nccl_watch: cannot capture the stack of silent rank pid %d (%s): %s", cap.pid, cap.outcome,
                    cap.message)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
