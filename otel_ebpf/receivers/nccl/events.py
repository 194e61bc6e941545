"""Typed events of the NCCL receiver: one frozen dataclass per record kind of ``nccl.h``.

Times are Unix epoch ns (converted once, in the receiver). ``comm`` / ``parent`` are the
process's ncclComm_t handles (addresses): meaningful only together with ``pid``. ``rc`` is the
call's ncclResult_t. ``seq`` is None when the kernel could not number the call (the
communicator's creation was not seen, or the call failed). ``group`` is the id of the
enclosing ncclGroupStart/End (0: none), unique within one receiver run.

The tables below name NCCL 2.x enum values (nccl.h 2.32.3; values are ABI-stable).
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = [
    "DATATYPES",
    "REDOPS",
    "RESULTS",
    "NcclCollective",
    "NcclCommBind",
    "NcclCommEnd",
    "NcclCommInfo",
    "NcclCommInit",
    "NcclCommInitAll",
    "NcclCommShrink",
    "NcclCommSplit",
    "NcclGroup",
    "NcclP2P",
    "NcclProfColl",
    "NcclProfComm",
    "NcclProfCommEnd",
    "NcclProfP2P",
    "datatype_name",
    "datatype_size",
    "redop_name",
    "result_name",
]

# ncclDataType_t -> (name, bytes per element)
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2),
    10: ("float8e4m3", 1), 11: ("float8e5m2", 1),
}
# ncclRedOp_t; values >= ncclNumOps (5) are user ops from ncclRedOpCreatePreMulSum
REDOPS: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
RESULTS: dict[int, str] = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
    4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
    8: "ncclTimeout",
}


def datatype_name(code: int) -> str:
    entry = DATATYPES.get(code)
    return entry[0] if entry else f"unknown({code})"


def datatype_size(code: int) -> int | None:
    entry = DATATYPES.get(code)
    return entry[1] if entry else None


def redop_name(code: int) -> str:
    return REDOPS.get(code, "premulsum" if code >= 5 else f"unknown({code})")


def result_name(rc: int) -> str:
    return RESULTS.get(rc, f"ncclResult({rc})")


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommInit:
    """ncclCommInitRank / ncclCommInitRankConfig / ncclCommInitRankScalable returned.
    ``function`` names which; ``unique_id`` is the 128-byte ncclUniqueId as passed (the first
    of the array for Scalable); ``comm`` is 0 when the call failed."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    function: str
    comm: int
    nranks: int
    rank: int
    unique_id: bytes
    rc: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommInitAll:
    """ncclCommInitAll returned: ``comms[i]`` is rank i of one communicator on ``devices[i]``."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    ndev: int
    comms: tuple[int, ...]
    devices: tuple[int, ...]
    rc: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommSplit:
    """ncclCommSplit(parent, color, key, newcomm) returned; ``comm`` is ``*newcomm`` at return: 0 for
    NCCL_SPLIT_NOCOLOR and, non-blocking, until NCCL publishes the child (a later :class:`NcclCommBind`
    names the handle by ``newcomm``, the out-parameter's address)."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    parent: int
    comm: int
    color: int
    key: int
    rc: int
    newcomm: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommShrink:
    """ncclCommShrink(parent, excludeRanksList, excludeRanksCount, &comm, config, shrinkFlags) returned.
    ``nexcluded`` is excludeRanksCount; ``excluded`` its first 64 ranks (all of them when
    ``len(excluded) == nexcluded``). ``comm`` is 0 when the call failed or, non-blocking, while the child
    is being made (NCCL 2.28.9 src/init.cc: the shrink makes its child as a split does; ``newcomm`` as in
    :class:`NcclCommSplit`)."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    parent: int
    comm: int
    nexcluded: int
    excluded: tuple[int, ...]
    flags: int
    rc: int
    newcomm: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommBind:
    """The first call on ``comm``, a handle NCCL published at ``newcomm`` after the non-blocking split or
    shrink of this process that passed that address returned: ``comm`` is that call's child. Comes before
    that call's own event."""

    pid: int
    tid: int
    time_ns: int
    comm: int
    newcomm: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommEnd:
    """ncclCommDestroy (``abort`` False) or ncclCommAbort returned."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    comm: int
    abort: bool
    rc: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCommInfo:
    """ncclCommCount / ncclCommUserRank / ncclCommCuDevice returned ``value`` (``what`` is
    ``nranks``, ``rank`` or ``device``); ``value`` is meaningful only when ``rc`` is 0."""

    pid: int
    tid: int
    time_ns: int
    comm: int
    what: str
    value: int
    rc: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclCollective:
    """A collective's host-side call (entry to return). ``op`` is the NCCL name without the
    prefix (``AllReduce``); ``redop``/``root`` are None for ops without one. ``captured``: made during a CUDA
    stream capture of its thread (the cuda receiver keeps them), so recorded into a graph, not run: it runs at
    each replay of the graph, which no NCCL call shows."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    op: str
    comm: int
    count: int
    datatype: int
    redop: int | None
    root: int | None
    stream: int
    seq: int | None
    group: int
    rc: int
    captured: bool = False
    api: int = 0  # the profiler plugin's CollApi handle started inside this call (NcclProfColl.api), 0: none


@fast_init
@dataclass(frozen=True, slots=True)
class NcclP2P:
    """ncclSend (``op`` "Send") or ncclRecv ("Recv") to/from ``peer``; ``seq`` counts per
    (communicator, peer, direction). ``captured`` as in :class:`NcclCollective`."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    op: str
    comm: int
    count: int
    datatype: int
    peer: int
    stream: int
    seq: int | None
    group: int
    rc: int
    captured: bool = False
    api: int = 0  # the profiler plugin's P2pApi handle started inside this call (NcclProfP2P.api), 0: none


@fast_init
@dataclass(frozen=True, slots=True)
class NcclGroup:
    """An outermost ncclGroupStart..ncclGroupEnd on one thread, with ``members`` calls inside, ``p2p``
    of them ncclSend/ncclRecv. ``simulated``: closed by ncclGroupSimulateEnd, so nothing was launched
    (its members' calls did no work). ``captured``: closed during a CUDA stream capture (as in
    :class:`NcclCollective`)."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    group: int
    members: int
    rc: int
    p2p: int = 0
    simulated: bool = False
    captured: bool = False


# ---- from otel-ebpf's NCCL profiler plugin (receivers/nccl/profiler.py; otel_ebpf/nccl_profiler/probes.h) ----
# Handles and contexts are the plugin's ids, unique per process while the event or communicator lives.


@fast_init
@dataclass(frozen=True, slots=True)
class NcclProfComm:
    """NCCL initialised a communicator (or the plugin re-announced a live one when the agent attached):
    ``context`` is the plugin's id for it in this process; ``comm_hash`` is NCCL's commHash, the same on every
    rank; ``rank``/``nranks``/``nnodes`` as NCCL has them (split children included)."""

    pid: int
    tid: int
    time_ns: int
    context: int
    comm_hash: int
    rank: int
    nranks: int
    nnodes: int
    name: str
    version: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclProfCommEnd:
    """NCCL finalised the communicator ``context``."""

    pid: int
    tid: int
    time_ns: int
    context: int


@fast_init
@dataclass(frozen=True, slots=True)
class NcclProfColl:
    """A collective NCCL planned (ncclProfileColl) and ran: ``seq`` is NCCL's per-function number on the
    communicator (comm->seqNumber[func]), ``func`` NCCL's name ("AllReduce"), ``algo``/``proto`` ("RING",
    "SIMPLE") and ``nchannels`` what NCCL chose; ``api`` the CollApi handle of the application call it came
    from. Sent once every kernel channel stopped: ``gpu_start``/``gpu_stop`` are the first channel's start and
    the last one's stop as NCCL read them from the GPU (%globaltimer ns, pTimer: converted by the processor),
    ``channels`` how many stopped; ``time_ns`` is when NCCL planned it."""

    pid: int
    tid: int
    time_ns: int
    handle: int
    context: int
    group: int
    api: int
    seq: int
    func: str
    count: int
    datatype: str
    root: int
    algo: str
    proto: str
    nchannels: int
    nwarps: int
    gpu_start: int = 0
    gpu_stop: int = 0
    channels: int = 0


@fast_init
@dataclass(frozen=True, slots=True)
class NcclProfP2P:
    """A send or recv NCCL planned (ncclProfileP2p) with ``peer`` and ran; the rest as in :class:`NcclProfColl`."""

    pid: int
    tid: int
    time_ns: int
    handle: int
    context: int
    group: int
    api: int
    func: str
    count: int
    datatype: str
    peer: int
    nchannels: int
    gpu_start: int = 0
    gpu_stop: int = 0
    channels: int = 0
