"""The NCCL receiver: probes on libnccl.so.2's host API, records decoded into typed events.

What is probed (x86-64, NCCL 2.x; symbols missing from older libraries are optional):

* communicators: ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitRankScalable (the
  128-byte ncclUniqueId is captured at entry), ncclCommInitAll, ncclCommSplit, ncclCommShrink
  (NCCL >= 2.27; the first 64 excluded ranks are read), ncclCommDestroy, ncclCommAbort, and the
  returns of ncclCommCount / ncclCommUserRank / ncclCommCuDevice (for callers that ask NCCL; PyTorch
  never does);
* collectives: AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather,
  Scatter and their ``*Config`` variants (same arguments first); ncclBcast is not probed: it
  calls ncclBroadcast (NCCL 2.32.3), which would count it twice;
* point-to-point: ncclSend, ncclRecv; groups: ncclGroupStart entry, ncclGroupEnd return,
  ncclGroupSimulateEnd (NCCL >= 2.22) entry and return: a group it closes launches nothing.

A non-blocking split's or shrink's child is named by the first call on its handle (NcclCommBind: the
program matches the handle to the address the split's caller passed, nccl.bpf.c); addresses that
could not be read are counted as ``otel_ebpf.events.dropped{receiver=nccl, reason=pending_unreadable}``.

Timing is host-side: a span covers the call into NCCL (argument checks and enqueueing the
work on the stream), not the GPU execution of the collective.

Thread safety: :meth:`NcclReceiver.decode` runs on the poll thread only (see BpfReceiver).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from otel_ebpf.bpf.attach import claim_library
from otel_ebpf.bpf.receiver import BpfReceiver, Probe
from otel_ebpf.bpf.usdt import UsdtError
from otel_ebpf.core.errors import AttachError
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.libraries import mapped_libraries
from otel_ebpf.host.procfs import process_gone
from otel_ebpf.nccl_profiler import plugin_path

from . import profiler as prof
from .config import Config
from .layouts import (
    COLL,
    COMM_BIND,
    COMM_END,
    COMM_INFO,
    COMM_INIT,
    COMM_INIT_ALL,
    COMM_SHRINK,
    COMM_SPLIT,
    COUNTERS,
    F_CAPTURED,
    F_SEQ,
    GROUP,
    GROUP_F_CAPTURED,
    GROUP_F_SIMULATED,
    INFO_KINDS,
    INIT_FUNCTIONS,
    LAYOUTS,
    Layout,
    OPS,
    P2P,
    PROF_COMM,
    PROF_COMM_END,
    PROF_KIND_P2P,
    PROF_OP,
    SHRINK_MAX,
)
from .events import (
    NcclCollective,
    NcclCommBind,
    NcclCommEnd,
    NcclCommInfo,
    NcclCommInit,
    NcclCommInitAll,
    NcclCommShrink,
    NcclCommSplit,
    NcclGroup,
    NcclP2P,
    NcclProfColl,
    NcclProfComm,
    NcclProfCommEnd,
    NcclProfP2P,
)

__all__ = ["INFO_KINDS", "INIT_FUNCTIONS", "LAYOUTS", "OPS", "PROBES", "Layout", "NcclReceiver"]

log = logging.getLogger(__name__)
SWEEP_INTERVAL_S = 10.0
GPU_OP_MAX_AGE_S = 300.0  # an op whose kernel channels have not all stopped by then is given up (the sweep)
SRC = Path(__file__).with_name("nccl.bpf.c")
PROF_SRC = Path(__file__).with_name("nccl_prof.bpf.c")
def _coll(symbol: str, entry: str, optional: bool = False) -> tuple[Probe, ...]:
    """The call and its NCCL 2.32 ``*Config`` variant (same leading arguments, optional)."""
    return (Probe(symbol, entry, "nccl_call_return", optional=optional),
            Probe(symbol + "Config", entry, "nccl_call_return", optional=True))


PROBES: tuple[Probe, ...] = (
    Probe("ncclCommInitRank", "nccl_init_rank_enter", "nccl_init_return"),
    Probe("ncclCommInitRankConfig", "nccl_init_rank_config_enter", "nccl_init_return", optional=True),
    Probe("ncclCommInitRankScalable", "nccl_init_rank_scalable_enter", "nccl_init_return", optional=True),
    Probe("ncclCommInitAll", "nccl_init_all_enter", "nccl_init_all_return"),
    Probe("ncclCommSplit", "nccl_split_enter", "nccl_split_return", optional=True),
    Probe("ncclCommShrink", "nccl_shrink_enter", "nccl_shrink_return", optional=True),
    Probe("ncclCommDestroy", "nccl_destroy_enter", "nccl_end_return"),
    Probe("ncclCommAbort", "nccl_abort_enter", "nccl_end_return"),
    Probe("ncclCommCount", "nccl_count_enter", "nccl_info_return", optional=True),
    Probe("ncclCommUserRank", "nccl_user_rank_enter", "nccl_info_return", optional=True),
    Probe("ncclCommCuDevice", "nccl_cu_device_enter", "nccl_info_return", optional=True),
    *_coll("ncclAllReduce", "nccl_all_reduce_enter"),
    *_coll("ncclBroadcast", "nccl_broadcast_enter"),
    *_coll("ncclReduce", "nccl_reduce_enter"),
    *_coll("ncclAllGather", "nccl_all_gather_enter"),
    *_coll("ncclReduceScatter", "nccl_reduce_scatter_enter"),
    *_coll("ncclAlltoAll", "nccl_all_to_all_enter", optional=True),
    *_coll("ncclGather", "nccl_gather_enter", optional=True),
    *_coll("ncclScatter", "nccl_scatter_enter", optional=True),
    Probe("ncclSend", "nccl_send_enter", "nccl_call_return"),
    Probe("ncclRecv", "nccl_recv_enter", "nccl_call_return"),
    Probe("ncclGroupStart", "nccl_group_start_enter"),
    Probe("ncclGroupEnd", None, "nccl_group_end_return"),
    Probe("ncclGroupSimulateEnd", "nccl_group_sim_end_enter", "nccl_group_end_return", optional=True),
)


class NcclReceiver(BpfReceiver):
    """Emits the events of :mod:`otel_ebpf.receivers.nccl.events`, plus ProcessExit/LibraryLoaded from
    the base. A record that cannot be decoded is counted (``decode_error``, by the base) or,
    for an unknown type byte, as ``otel_ebpf.events.dropped{reason=unknown_record}``."""

    name = "nccl"
    src_file = SRC
    library_key = "nccl"
    lib_pattern = "libnccl"  # the kernel's openat match: libnccl.so.* and NCCL plugins (libnccl-profiler-*.so)
    probes: Sequence[Probe] = PROBES
    thread_context = True  # reads the open CUDA stream captures the cuda program keeps in oe_thread_ctx

    def __init__(self, ctx: Context, next_: Consumer, config: Config | None = None) -> None:
        self.config = config or Config()
        super().__init__(ctx, next_, ringbuf_pages=self.config.ringbuf_pages,
                         pause_on_load=self.config.pause_on_load, extra_libraries=self.config.libraries,
                         poll_interval=self.config.poll_interval)
        self._decoders: dict[int, Callable[[bytes], object]] = {
            COMM_INIT.etype: self._comm_init, COMM_INIT_ALL.etype: self._comm_init_all,
            COMM_SPLIT.etype: self._comm_split, COMM_END.etype: self._comm_end,
            COMM_INFO.etype: self._comm_info, COLL.etype: self._coll, P2P.etype: self._p2p,
            GROUP.etype: self._group, COMM_SHRINK.etype: self._comm_shrink, COMM_BIND.etype: self._comm_bind,
            PROF_COMM.etype: self._prof_comm, PROF_COMM_END.etype: self._prof_comm_end,
            PROF_OP.etype: self._prof_op,
        }
        self._plugin = prof.PluginProbes()
        self._counters_seen = [0] * len(COUNTERS)  # counters[] as last read
        self._last_sweep = time.monotonic()

    def start(self) -> None:
        first = self.bpf is None
        if first:
            for lib in self._plugin_libraries():
                try:
                    self._plugin.learn(lib)  # its probes' argument readers are compiled with the program
                except (UsdtError, OSError) as exc:
                    log.debug("%s: %s is no otel-ebpf NCCL profiler plugin: %s", self.name, lib, exc)
        super().start()
        if first:
            self.bpf.attach_tracepoint(tp="sched:sched_process_exit", fn_name="nccl_thread_exit")

    def source(self) -> str:
        """nccl.bpf.c, then the profiler plugin's handlers and the generated readers (BCC rewrites map calls in
        the program text only, not in files it includes)."""
        return (f"{super().source()}\n// ---- {PROF_SRC.name}\n#line 1 \"{PROF_SRC}\"\n{PROF_SRC.read_text()}\n"
                f"// ---- generated: profiler plugin probe readers\n{self._plugin.source()}\n")

    def initial_libraries(self, pids: Sequence[int] = ()) -> list[str]:
        found = super().initial_libraries(pids)
        return found + [p for p in self._plugin_libraries(pids) if p not in found]

    def _plugin_libraries(self, pids: Sequence[int] = ()) -> list[str]:
        """The agent's own profiler plugin, plugins named in ``libraries``, and those mapped by traced processes
        (``pids``, default the targets)."""
        own = plugin_path()
        paths = [str(own)] if own is not None else []
        paths += [p for p in self.config.libraries if prof.is_plugin(p)]
        for pid in pids or self.ctx.target_pids:
            paths += mapped_libraries(pid, prof.PLUGIN_PREFIX)
        seen: set[str] = set()
        out: list[str] = []
        for p in paths:
            real = os.path.realpath(p)
            if real not in seen and os.path.isfile(p):
                seen.add(real)
                out.append(p)
        return out

    def probes_for(self, path: str) -> Sequence[Probe]:
        """NCCL's own library gets the uprobes (none with ``host_calls: false``); its plugins (net, tuner,
        profiler: libnccl-*.so), which the kernel's openat match also reports, none (the profiler plugin is
        attached by :meth:`attach_library`)."""
        if os.path.basename(path).startswith("libnccl-") or not self.config.host_calls:
            return ()
        return self.probes

    def attach_library(self, path: str) -> int:
        """libnccl: the base's uprobes. An NCCL profiler plugin: its USDT probes (profiler.py), one log line."""
        if not prof.is_plugin(path):
            return super().attach_library(path)
        with self._attach_lock:
            real = claim_library(self._attached, path, self.bpf is not None)
            if real is None:
                return 0
            try:
                n = self._plugin.attach(self.bpf, real)
            except prof.VariantError as exc:  # ours, built differently: its GPU time is lost until a restart
                self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                       library=os.path.basename(real))
                log.warning("%s: profiler plugin %s not attached: %s", self.name, real, exc)
                return 0
            except UsdtError as exc:  # another plugin (NCCL Inspector, a user's): nothing of ours to attach
                log.info("%s: profiler plugin %s not attached: %s", self.name, real, exc)
                return 0
            except OSError as exc:
                self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                       library=os.path.basename(real))
                if self.ctx.strict:
                    raise AttachError(real, "otel_ebpf_nccl probes", str(exc)) from None
                log.warning("%s: profiler plugin %s: %s", self.name, real, exc)
                return 0
        self.ctx.telemetry.add("otel_ebpf.probes.attached", n, receiver=self.name, library=os.path.basename(real))
        log.info("%s: attached %d profiler probes to %s", self.name, n, real)
        return n

    def shutdown(self) -> None:
        self._plugin.close()  # the semaphores drop: the plugins narrow NCCL's mask at their next group
        super().shutdown()

    def poll_maps(self) -> list[object]:
        for name, grown in self._array_deltas("counters", COUNTERS, self._counters_seen):
            if name:  # [0], [1] are id counters, not losses
                self.ctx.telemetry.dropped(self.name, name, grown)
        now = time.monotonic()
        if now - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = now
            self.sweep()
        return []

    def sweep(self) -> int:
        """Free the kernel's communicator state (and non-blocking split children waiting for a
        handle) of processes that have exited (PyTorch often
        exits without ncclCommDestroy), zombies included: they make no more calls; and the profiler's ops and
        kernel channels (nccl_prof.bpf.c) of exited processes, or older than ``GPU_OP_MAX_AGE_S`` (a kernel that
        never ended, channel events lost), those counted as ``otel_ebpf.events.dropped{reason=gpu_op_expired}``.
        Returns how many entries were freed. PIDs are those of the agent's PID namespace, as everywhere in
        BpfReceiver. Poll thread only."""
        freed = 0
        for name in ("comms", "nb_pending"):  # keyed by (tgid, handle) / by tgid
            table = self.bpf[name]
            freed += _delete(table, [k for k in table.keys() if process_gone(k.tgid if name == "comms" else k.value)])
        oldest = self.clock.now_monotonic_ns() - int(GPU_OP_MAX_AGE_S * 1e9)
        for name in ("prof_ops", "prof_chs"):
            table = self.bpf[name]
            gone, expired = [], []
            for k, v in table.items():
                if process_gone(k.tgid):
                    gone.append(k)
                elif (v.op.ts if name == "prof_ops" else v.ts) < oldest:
                    expired.append(k)
            freed += _delete(table, gone)
            lost = _delete(table, expired)
            if lost and name == "prof_ops":
                self.ctx.telemetry.dropped(self.name, "gpu_op_expired", lost)
            freed += lost
        return freed

    def cflags(self) -> list[str]:
        c = self.config
        return [f"-DNCCL_MAX_INFLIGHT={c.max_inflight}", f"-DNCCL_MAX_COMMS={c.max_comms}",
                f"-DNCCL_MAX_P2P={c.max_p2p_counters}"]

    def decode(self, etype: int, raw: bytes) -> object | None:
        decoder = self._decoders.get(etype)
        if decoder is None:
            self.ctx.telemetry.dropped(self.name, "unknown_record")
            return None
        return decoder(raw)

    def _ns(self, ts: int) -> int:
        return self.clock.to_epoch_ns(ts)

    # ---- records of otel-ebpf's NCCL profiler plugin (profiler.py) ----
    def _prof_comm(self, raw: bytes) -> NcclProfComm:
        _, pid, tid, ts, context, rec = PROF_COMM.struct.unpack_from(raw)
        comm_hash, rank, nranks, nnodes, version, name = prof.COMM_REC.unpack(rec)
        return NcclProfComm(pid, tid, self._ns(ts), context, comm_hash, rank, nranks, nnodes, prof.text(name), version)

    def _prof_comm_end(self, raw: bytes) -> NcclProfCommEnd:
        _, pid, tid, ts, context = PROF_COMM_END.struct.unpack_from(raw)
        return NcclProfCommEnd(pid, tid, self._ns(ts), context)

    def _prof_op(self, raw: bytes) -> NcclProfColl | NcclProfP2P:
        _, kind, pid, tid, channels, ts, handle, gpu_start, gpu_stop, rec = PROF_OP.struct.unpack_from(raw)
        if kind == PROF_KIND_P2P:
            context, group, count, _buff, peer, nchannels, func, datatype, api = prof.P2P_REC.unpack_from(rec)
            return NcclProfP2P(pid, tid, self._ns(ts), handle, context, group, api, prof.text(func), count,
                               prof.text(datatype), peer, nchannels, gpu_start, gpu_stop, channels)
        (context, group, seq, count, _send, _recv, root, nchannels, nwarps, func, datatype, algo, proto,
         api) = prof.COLL_REC.unpack(rec)
        return NcclProfColl(pid, tid, self._ns(ts), handle, context, group, api, seq, prof.text(func), count,
                            prof.text(datatype), root, prof.text(algo), prof.text(proto), nchannels, nwarps,
                            gpu_start, gpu_stop, channels)

    def _comm_init(self, raw: bytes) -> NcclCommInit:
        _, kind, pid, tid, rc, nranks, rank, t0, t1, comm, uid = COMM_INIT.struct.unpack_from(raw)
        return NcclCommInit(pid, tid, self._ns(t0), self._ns(t1), INIT_FUNCTIONS[kind], comm, nranks,
                            rank, uid, rc)

    def _comm_init_all(self, raw: bytes) -> NcclCommInitAll:
        v = COMM_INIT_ALL.struct.unpack_from(raw)
        _, pid, tid, rc, ndev, t0, t1 = v[:7]
        n = max(0, min(ndev, 32))
        return NcclCommInitAll(pid, tid, self._ns(t0), self._ns(t1), ndev, tuple(v[7:7 + n]),
                               tuple(v[39:39 + n]), rc)

    def _comm_split(self, raw: bytes) -> NcclCommSplit:
        _, pid, tid, rc, color, key, t0, t1, parent, comm, newcomm = COMM_SPLIT.struct.unpack_from(raw)
        return NcclCommSplit(pid, tid, self._ns(t0), self._ns(t1), parent, comm, color, key, rc, newcomm)

    def _comm_bind(self, raw: bytes) -> NcclCommBind:
        _, pid, tid, ts, comm, newcomm = COMM_BIND.struct.unpack_from(raw)
        return NcclCommBind(pid, tid, self._ns(ts), comm, newcomm)

    def _comm_end(self, raw: bytes) -> NcclCommEnd:
        _, kind, pid, tid, rc, t0, t1, comm = COMM_END.struct.unpack_from(raw)
        return NcclCommEnd(pid, tid, self._ns(t0), self._ns(t1), comm, kind == 1, rc)

    def _comm_info(self, raw: bytes) -> NcclCommInfo:
        _, kind, pid, tid, rc, value, ts, comm = COMM_INFO.struct.unpack_from(raw)
        return NcclCommInfo(pid, tid, self._ns(ts), comm, INFO_KINDS[kind], value, rc)

    def _coll(self, raw: bytes) -> NcclCollective:
        (_, op, flags, pid, tid, rc, dtype, redop, root, t0, t1, count, comm, stream, seq,
         group, api) = COLL.struct.unpack_from(raw)
        return NcclCollective(pid, tid, self._ns(t0), self._ns(t1), OPS[op], comm, count, dtype,
                              redop if redop >= 0 else None, root if root >= 0 else None, stream,
                              seq if flags & F_SEQ else None, group, rc, bool(flags & F_CAPTURED), api)

    def _p2p(self, raw: bytes) -> NcclP2P:
        (_, op, flags, pid, tid, rc, dtype, peer, t0, t1, count, comm, stream, seq,
         group, api) = P2P.struct.unpack_from(raw)
        return NcclP2P(pid, tid, self._ns(t0), self._ns(t1), OPS[op], comm, count, dtype, peer, stream,
                       seq if flags & F_SEQ else None, group, rc, bool(flags & F_CAPTURED), api)

    def _group(self, raw: bytes) -> NcclGroup:
        _, flags, pid, tid, rc, members, p2p, t0, t1, group = GROUP.struct.unpack_from(raw)
        return NcclGroup(pid, tid, self._ns(t0), self._ns(t1), group, members, rc, p2p,
                         bool(flags & GROUP_F_SIMULATED), bool(flags & GROUP_F_CAPTURED))

    def _comm_shrink(self, raw: bytes) -> NcclCommShrink:
        v = COMM_SHRINK.struct.unpack_from(raw)
        _, pid, tid, rc, n, flags, t0, t1, parent, comm, newcomm = v[:11]
        excluded = tuple(v[11:11 + max(0, min(n, SHRINK_MAX))])
        return NcclCommShrink(pid, tid, self._ns(t0), self._ns(t1), parent, comm, n, excluded, flags, rc,
                              newcomm)


def _delete(table: object, keys: list[object]) -> int:
    """Delete ``keys`` from BPF map ``table``; how many were there."""
    n = 0
    for key in keys:
        try:
            del table[key]  # type: ignore[attr-defined]
            n += 1
        except KeyError:
            pass
    return n
