"""A BPF program's ring buffers, read on one thread: in C (``otel_ebpf.bpf._ringread``) when it is built, else
through BCC's per-record callbacks.

Both read through libbpf's ring buffer manager, as BCC's ``ring_buffer_poll``/``ring_buffer_consume`` do, and
hand each record's bytes to ``on_raw`` in the order libbpf read them. The C reader copies the records of one call
without the GIL and makes them ``bytes`` in one go, instead of a ctypes callback (argument conversion, the GIL
taken and given back, a ``string_at`` copy) per record: ``bench/run.py --pipeline-only [--bcc-rings]``,
docs/benchmarks.md. Records the C reader consumed but could not keep (no memory for its buffer) are counted:
``otel_ebpf.events.dropped{receiver, reason=ringread_no_memory}``.

Threading: :meth:`Rings.poll`, :meth:`Rings.consume` and :meth:`Rings.close` from the owner's poll thread (close
also after that thread has ended). ``on_raw`` runs on the calling thread, must not raise (the receiver counts a
bad record itself) and may be called for up to :data:`MAX_RECORDS` records per call.
"""
from __future__ import annotations

import ctypes as ct
import logging
from collections.abc import Callable, Sequence
from typing import Any

from otel_ebpf.core.telemetry import Telemetry

__all__ = ["MAX_BYTES", "MAX_RECORDS", "NATIVE", "Rings"]

log = logging.getLogger(__name__)
MAX_RECORDS = 16_384  # records one poll or consume takes at most (the rest stay in the ring for the next)
MAX_BYTES = 8 << 20  # and bytes: the reader's buffer grows to about this much

try:
    from otel_ebpf.bpf import _ringread  # type: ignore[attr-defined]
except ImportError:  # the optional extension is not built (no C compiler): BCC's callbacks
    _ringread = None
NATIVE = _ringread is not None
use_native = True  # False: every Rings made from now on reads through BCC's callbacks (bench/run.py --bcc-rings)


def _entry_points() -> tuple[int, ...]:
    """libbcc's ring buffer functions, as addresses (the ones bcc.BPF's ring_buffer_poll calls)."""
    from bcc.libbcc import lib

    names = ("bpf_new_ringbuf", "bpf_add_ringbuf", "bpf_poll_ringbuf", "bpf_consume_ringbuf", "bpf_free_ringbuf")
    return tuple(ct.cast(getattr(lib, n), ct.c_void_p).value or 0 for n in names)


class Rings:
    """The ring buffer maps ``tables`` of the BCC program ``bpf``, read into ``on_raw(bytes)``, or, with the C
    reader and ``on_records``, into ``on_records(list of bytes)`` a call's records at a time (in the same order;
    never an empty list). ``receiver`` names the owner in the drop counter. The C reader reads them when it is built and
    :data:`use_native` is true."""

    def __init__(self, bpf: Any, tables: Sequence[str], on_raw: Callable[[bytes], object], telemetry: Telemetry,
                 receiver: str, on_records: Callable[[list[bytes]], object] | None = None) -> None:
        self._bpf, self._on_raw, self._telemetry, self._receiver = bpf, on_raw, telemetry, receiver
        self._on_records = on_records
        self._reader: Any = None
        self._lost = 0
        if use_native and _ringread is not None:
            new, add, poll, consume, free = _entry_points()
            reader = _ringread.Reader(new, add, poll, consume, free, MAX_RECORDS, MAX_BYTES)
            for t in tables:
                reader.add(bpf[t].map_fd)
            self._reader = reader
        else:
            for t in tables:
                bpf[t].open_ring_buffer(self._on_record)

    @property
    def native(self) -> bool:
        """Whether the C reader reads these rings."""
        return self._reader is not None

    def _on_record(self, _ctx: Any, data: Any, size: int) -> int:
        self._on_raw(ct.string_at(data, size))
        return 0

    def _hand_on(self, records: list[bytes]) -> None:
        if self._on_records is not None:
            if records:
                self._on_records(records)
        else:
            on_raw = self._on_raw
            for raw in records:
                on_raw(raw)
        lost = self._reader.lost
        if lost != self._lost:
            self._telemetry.dropped(self._receiver, "ringread_no_memory", lost - self._lost)
            self._lost = lost

    def poll(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for records, then hand on those there."""
        if self._reader is None:
            self._bpf.ring_buffer_poll(timeout_ms)
        else:
            self._hand_on(self._reader.poll(timeout_ms))

    def consume(self) -> None:
        """Hand on the records there, without waiting."""
        if self._reader is None:
            self._bpf.ring_buffer_consume()
        else:
            self._hand_on(self._reader.consume())

    def close(self) -> None:
        """Free the C reader's ring buffer manager (BCC frees its own at cleanup). Safe twice."""
        if self._reader is not None:
            try:
                self._reader.close()
            except RuntimeError:  # still polling on a thread that did not end: freed with the process
                log.debug("%s: ring reader still in use at close", self._receiver)
