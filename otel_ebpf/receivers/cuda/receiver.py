"""The CUDA runtime receiver: uprobes on libcudart (cuda.bpf.c) -> typed events (events.py).

Calls are paired in the kernel and arrive as one ring-buffer record each (memcpy, synchronize and
graph-launch calls over the span rate limit get none); kernel launches, and every memcpy, synchronize
and graph-launch call, are counted in the kernel and read here, at most every ``stats_interval``, as
:class:`KernelLaunchStats` and :class:`CallStats` deltas. Counters of processes that are gone are read one last time
and deleted, and everything is read once more at shutdown.

Threading: ``decode`` and ``poll_maps`` run on the receiver's poll thread only (see
:class:`otel_ebpf.bpf.receiver.BpfReceiver`); they never raise for a bad record (the base counts it as
``decode_error``).
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path

from otel_ebpf.bpf import threadctx
from otel_ebpf.bpf.loader import all_pids
from otel_ebpf.bpf.maps import MapDeltas
from otel_ebpf.bpf.receiver import BpfReceiver, Probe
from otel_ebpf.bpf.records import Mirror, RecordDecoders, call, decoder, epoch, flag, index, uint
from otel_ebpf.core.buckets import bounds_for_unit
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.libraries import mapped_libraries

from .apis import _SYMBOLS, APIS, DRIVER_PROBES, PROBES, Api
from .config import Config
from .kernels import KernelNames
from .learning import DeviceLearning
from .events import (
    AllocCall,
    CallStats,
    EnclosingCall,
    FreeCall,
    GraphLaunchCall,
    KernelLaunch,
    KernelLaunchStats,
    MemcpyCall,
    SetDeviceCall,
    SyncCall,
)

__all__ = ["ALLOC", "APIS", "DRIVER_PROBES", "FREE", "GRAPH", "KERNEL", "LAUNCH", "MEMCPY", "MIRRORS", "PROBES",
           "SET_DEVICE", "SYNC", "Api", "CudaReceiver"]

log = logging.getLogger(__name__)
_RUNTIME_PREFIX, _DRIVER_PREFIX = "libcudart.so", "libcuda.so"


_CALL_FMT = "BBBBiIIQQi4xQQ"
_CALL_FIELDS = tuple(f"call.{f}" for f in ("type", "api", "ctx_kind", "captured", "device", "pid", "tid", "start_ns",
                                          "end_ns", "rc", "ctx_start", "ctx_root"))
MEMCPY = Mirror("cuda_memcpy_rec", 16, struct.Struct("<" + _CALL_FMT + "QQQQI4x"),
                (*_CALL_FIELDS, "dst", "src", "bytes", "stream", "kind"))
ALLOC = Mirror("cuda_alloc_rec", 17, struct.Struct("<" + _CALL_FMT + "QQQI4x"),
               (*_CALL_FIELDS, "ptr", "size", "stream", "flags"))
FREE = Mirror("cuda_free_rec", 18, struct.Struct("<" + _CALL_FMT + "QQ"),
              (*_CALL_FIELDS, "ptr", "stream"))
SYNC = Mirror("cuda_sync_rec", 19, struct.Struct("<" + _CALL_FMT + "Q"), (*_CALL_FIELDS, "handle"))
SET_DEVICE = Mirror("cuda_set_device_rec", 20, struct.Struct("<" + _CALL_FMT + "i4x"),
                    (*_CALL_FIELDS, "requested"))
LAUNCH = Mirror("cuda_launch_rec", 21, struct.Struct("<BBBBiIIQQ3I3IQQQQQ"),
                ("type", "api", "ctx_kind", "captured", "device", "pid", "tid", "ts", "func", "grid[0]", "grid[1]",
                 "grid[2]", "block[0]", "block[1]", "block[2]", "shared_mem", "stream", "seq", "ctx_start", "ctx_root"))
GRAPH = Mirror("cuda_graph_rec", 22, struct.Struct("<" + _CALL_FMT + "QQ"), (*_CALL_FIELDS, "exec", "stream"))
KERNEL = Mirror("cuda_kernel_rec", 23, struct.Struct("<BB2xIQQ160s"),
                ("type", "api", "pid", "handle", "host_fun", "name"))
CTX_KINDS = {1: "python", 2: "torch"}  # cuda.h CUDA_CTX_*
MIRRORS: tuple[Mirror, ...] = (MEMCPY, ALLOC, FREE, SYNC, SET_DEVICE, LAUNCH, GRAPH, KERNEL)
_CALL_EVENTS: dict[int, tuple[struct.Struct, type]] = {
    MEMCPY.etype: (MEMCPY.fmt, MemcpyCall),
    ALLOC.etype: (ALLOC.fmt, AllocCall),
    FREE.etype: (FREE.fmt, FreeCall),
    SYNC.etype: (SYNC.fmt, SyncCall),
    SET_DEVICE.etype: (SET_DEVICE.fmt, SetDeviceCall),
    GRAPH.etype: (GRAPH.fmt, GraphLaunchCall),
}



def _enclosing_call(kind: int, start_ns: int, root_ns: int) -> EnclosingCall:
    return EnclosingCall(CTX_KINDS[kind], start_ns, root_ns)


def _call_decoders() -> RecordDecoders:
    """The completed calls' records decoded in C (otel_ebpf.bpf.records): the events :meth:`CudaReceiver.decode`
    makes of them (tests/unit/receivers/test_cuda_decode.py compares the two). Launches (sampled) and kernel
    names (learned, no event) stay in Python."""
    common = {"pid": uint("call.pid"), "tid": uint("call.tid"), "api": index("call.api", _SYMBOLS),
              "device": uint("call.device"), "start_ns": epoch("call.start_ns"), "end_ns": epoch("call.end_ns"),
              "rc": uint("call.rc"), "captured": flag("call.captured"),
              "enclosing": call(_enclosing_call, "call.ctx_kind", "call.ctx_start", "call.ctx_root")}
    by_type = {}
    for mirror, cls in ((MEMCPY, MemcpyCall), (ALLOC, AllocCall), (FREE, FreeCall), (SYNC, SyncCall),
                        (SET_DEVICE, SetDeviceCall), (GRAPH, GraphLaunchCall)):
        rest = {name: uint(name) for name in mirror.fields if not name.startswith("call.")}
        made = decoder(mirror, cls, **common, **rest)
        if made is not None:
            by_type[mirror.etype] = made
    return RecordDecoders(by_type)


LaunchKey = tuple[int, int, int, int, int, int, int, int]  # pid, device, grid, block, operator, api id, func, captured
CallKey = tuple[int, int, int, int, int, int]  # pid, device, rc, api id, kind, captured
# The in-kernel call histograms use the emitter's own bounds, so their buckets merge as they are.
DUR_BOUNDS_NS = tuple(round(b * 1e9) for b in bounds_for_unit("s"))
BYTES_BOUNDS = tuple(int(b) for b in bounds_for_unit("By"))


class CudaReceiver(BpfReceiver):
    """Receiver ``cuda``: typed CUDA runtime events for the processes in ``ctx.target_pids``
    (and their children), or every process that maps libcudart when there are none."""

    name = "cuda"
    src_file = Path(__file__).with_name("cuda.bpf.c")
    library_key = "cudart"
    library_keys = ("cudart", "cuda_driver")
    lib_pattern = "libcuda"  # the kernel's openat match: libcudart.so.* and libcuda.so.* alike
    probes = PROBES

    def probes_for(self, path: str) -> Sequence[Probe]:
        """The runtime's probes on a libcudart, the driver's on a libcuda; none on another ``libcuda*``
        (``libcudadebugger.so``)."""
        base = os.path.basename(path)
        if base.startswith(_RUNTIME_PREFIX):
            return PROBES
        if base.startswith(_DRIVER_PREFIX):
            return DRIVER_PROBES
        return ()

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages,
                         pause_on_load=config.pause_on_load, extra_libraries=config.libraries,
                         poll_interval=config.poll_interval)
        self.config = config
        self._launches: MapDeltas[LaunchKey] = MapDeltas(
            lambda key: (key.pid, key.device, key.grid_size, key.block_size, key.op, key.api, key.func, key.captured),
            lambda per_cpu: (sum(per_cpu),))
        nd, nb = len(DUR_BOUNDS_NS) + 1, len(BYTES_BOUNDS) + 1
        self._calls: MapDeltas[CallKey] = MapDeltas(
            lambda key: (key.pid, key.device, key.rc, key.api, key.kind, key.captured),
            lambda v: (v.calls, v.limited, v.dur_ns, v.bytes, *v.dur_hist[:nd], *v.bytes_hist[:nb]))
        self._next_stats = 0.0
        self._final_read = False
        self._kernels = KernelNames(config.max_kernel_names)
        self._learning = DeviceLearning(config.learn_device_for, self._attach_one, self.detach_uprobe,
                                        self._attach_lock)
        self._evicted_seen = 0
        self._gone: list[int] = []

    record_decoders = _call_decoders()
    thread_context = True  # oe_thread_ctx: it keeps each thread's open stream captures there (the nccl program reads)

    @property
    def call_context(self) -> bool:
        """Read the per-thread call slots (nesting) only when a python or torch receiver of this
        agent writes them: without one every lookup would miss, and launches keep the cheapest path."""
        return self.config.nesting and bool(self.ctx.thread_ctx_writers)

    def cflags(self) -> list[str]:
        c = self.config
        return [f"-DCUDA_MAX_INFLIGHT={c.max_inflight}", f"-DCUDA_MAX_THREADS={c.max_threads}",
                f"-DCUDA_MAX_LAUNCH_KEYS={c.max_launch_keys}",
                f"-DCUDA_LAUNCH_SAMPLE_EVERY={c.launch_sample_every}",
                f"-DCUDA_CALL_CONTEXT={1 if self.call_context else 0}",
                f"-DCUDA_LAUNCH_CONTEXT={1 if self.call_context and c.launch_context else 0}",
                f"-DCUDA_LAUNCH_FUNC={1 if c.kernel_names else 0}",
                f"-DCUDA_MAX_CALL_KEYS={c.max_call_keys}", f"-DCUDA_SPAN_RATE={c.span_rate_limit}",
                f"-DCUDA_SPAN_SLOW_NS={round(c.always_span_slower_than * 1e9)}",
                f"-DCUDA_DUR_BOUNDS_NS={','.join(map(str, DUR_BOUNDS_NS))}", f"-DCUDA_DUR_NBOUNDS={len(DUR_BOUNDS_NS)}",
                f"-DCUDA_BYTES_BOUNDS={','.join(map(str, BYTES_BOUNDS))}",
                f"-DCUDA_BYTES_NBOUNDS={len(BYTES_BOUNDS)}"]

    def _enclosing(self, kind: int, start: int, root: int) -> EnclosingCall | None:
        if not kind:
            return None
        to_epoch = self.clock.to_epoch_ns  # the same offset as the python/torch receivers' (otel_ebpf.bpf.receiver)
        return EnclosingCall(CTX_KINDS[kind], to_epoch(start), to_epoch(root))

    # ---- ring-buffer records ----------------------------------------------------------
    def decode(self, etype: int, raw: bytes) -> object | None:
        """One record -> one event. Raises on a malformed record (the base counts it)."""
        call = _CALL_EVENTS.get(etype)
        if call is not None:
            fmt, cls = call
            _, api, kind, captured, device, pid, tid, start, end, rc, cstart, croot, *rest = fmt.unpack_from(raw)
            to_epoch = self.clock.to_epoch_ns
            event: object = cls(pid, tid, _SYMBOLS[api], device, to_epoch(start), to_epoch(end), rc, *rest,
                                enclosing=self._enclosing(kind, cstart, croot), captured=bool(captured))
            return event
        if etype == LAUNCH.etype:
            (_, api, kind, captured, device, pid, tid, ts, func, gx, gy, gz, bx, by, bz, smem, stream,
             seq, cstart, croot) = LAUNCH.fmt.unpack_from(raw)
            return KernelLaunch(pid, tid, _SYMBOLS[api], device, self.clock.to_epoch_ns(ts), func,
                                (gx, gy, gz), (bx, by, bz), smem, stream, seq,
                                enclosing=self._enclosing(kind, cstart, croot),
                                kernel=self._kernels.name(pid, func) if self.config.kernel_names else "",
                                captured=bool(captured))
        if etype == KERNEL.etype:
            _, api, pid, handle, host_fun, name = KERNEL.fmt.unpack_from(raw)
            if api >= len(_SYMBOLS):
                raise ValueError(f"kernel record of unknown api {api}")
            if self.config.kernel_names:
                self._kernels.learn(pid, handle, host_fun, name.split(b"\0", 1)[0].decode(errors="replace"))
            return None
        raise ValueError(f"unknown CUDA record type {etype}")

    def process_seen(self, pid: int, refresh: bool) -> None:
        """Read ``pid``'s mappings while it lives, so its kernels' host functions can be named after it exits."""
        if self.config.kernel_names:
            self._kernels.seen(pid, refresh)

    def process_exited(self, pid: int) -> None:
        """Forget ``pid``'s kernel handles after its last launch counts are read (the next :meth:`poll_maps`)."""
        self._gone.append(pid)

    # ---- in-kernel launch counters ----------------------------------------------------
    def poll_maps(self) -> list[object]:
        self._learning.poll()
        now = time.monotonic()
        if not self._final_read and now < self._next_stats:
            return []
        self._next_stats = now + self.config.stats_interval
        out: list[object] = []
        gone, self._gone = self._gone, []
        for read in (self.read_launch_stats, self.read_call_stats):
            try:
                out.extend(read())
            except Exception:  # a map read must not stop the poll loop
                log.debug("%s: %s failed", self.name, read.__name__, exc_info=True)
                self.ctx.telemetry.dropped(self.name, "map_read_error")
        for pid in gone:
            self._kernels.forget(pid)
        evicted = self._kernels.evicted - self._evicted_seen
        if evicted:
            self._evicted_seen += evicted
            self.ctx.telemetry.dropped(self.name, "kernel_names_full", evicted)
        return out

    def read_call_stats(self) -> list[CallStats]:
        """Deltas of every memcpy/synchronize call counter since the last read; counters of
        processes that are gone are deleted after this (final) read."""
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        nd = len(DUR_BOUNDS_NS) + 1
        return [CallStats(k[0], _SYMBOLS[k[3]], k[1], k[2], k[4], d[0], d[1], d[2], d[3], d[4:4 + nd], d[4 + nd:],
                          now_ns, bool(k[5]))
                for k, d in self._calls.moved(self.bpf["call_stats"])]

    def read_launch_stats(self) -> list[KernelLaunchStats]:
        """Deltas of every launch counter since the last read, largest first (processors.cuda admits kernel
        names in this order); counters of processes that are gone are deleted after this (final) read. A
        counter's operator address is named by the torch receiver of the same agent (otel_ebpf.bpf.threadctx),
        while the process lives; its kernel by :class:`.kernels.KernelNames`."""
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        names = self._kernels
        moved = sorted(self._launches.moved(self.bpf["launch_stats"]), key=lambda kd: -kd[1][0])  # busiest first
        return [KernelLaunchStats(k[0], k[1], k[2], k[3], d[0], now_ns,
                                  (threadctx.op_name(self.ctx, k[0], k[4]) or "") if k[4] else "",
                                  _SYMBOLS[k[5]] if k[5] < len(_SYMBOLS) else "",
                                  names.name(k[0], k[6]) if k[6] else "", bool(k[7]))
                for k, d in moved]

    # ---- a thread's current device, for the other components (core.services.CudaThreads) ----------
    def start(self) -> None:
        if self.config.kernel_names:
            for pid in self.ctx.target_pids:  # alive now: their mappings name their kernels even after they exit
                self._kernels.seen(pid)
        super().start()
        self._learning.begin(self.ctx.target_pids or all_pids())
        if self.ctx.cuda_threads is None:
            self.ctx.cuda_threads = self

    def device_of(self, pid: int, tid: int) -> int | None:
        """Thread ``tid``'s device now: its entry in the program's ``thread_device`` map (written when its
        cudaSetDevice succeeds, 0 from its first launch), else 0 (CUDA's default) when ``pid`` maps a
        libcudart or libcuda this receiver probes, else None. One map lookup and at most one /proc read; thread-safe."""
        bpf = self.bpf
        if bpf is None:
            return None
        try:
            value = bpf["thread_device"].get(ct.c_uint32(tid))
        except Exception:  # a map read must not fail the caller (the nccl processor's hot path)
            value = None
        if value is not None:
            return int(value.device)
        with self._attach_lock:
            attached = set(self._attached)
        return 0 if any(path in attached for path in mapped_libraries(pid, self.lib_pattern or "")) else None

    def shutdown(self) -> None:
        if self.ctx.cuda_threads is self:
            self.ctx.cuda_threads = None
        self._final_read = True  # the base's last drain reads the counters one more time
        self._learning.end()
        super().shutdown()
