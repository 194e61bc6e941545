"""NCCL spans as the agent sends them (otel_ebpf/processors/nccl/processor.py), built with the SDK, for
tests of the gateway's collective join: one rank's span and rank 0's root span."""
from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from otel_ebpf.core.ids import collective_ids

__all__ = ["COMM", "SCOPE", "node", "rank_span", "root_span"]

COMM = "00c0ffee00c0ffee"
SCOPE = InstrumentationScope("otel_ebpf.nccl")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NODES: dict[str, Resource] = {}


def node(host: str) -> Resource:
    """One shared resource per host name (as one agent's process would have)."""
    if host not in _NODES:
        _NODES[host] = Resource.create({"host.name": host, "service.name": "train"})
    return _NODES[host]


def rank_span(seq: int, rank: int, start_ns: int, *, nranks: int = 4, comm: str = COMM, count: int = 1024,
              op: str = "AllReduce", dur: int = 1000, host: str | None = None, resource: Resource | None = None,
              extra: dict | None = None) -> ReadableSpan:
    """Rank ``rank``'s span of collective ``seq`` (host: node-a for ranks 0-1, else node-b; or ``resource``), with
    ``extra`` attributes (``hw.id``, ``ml.step.*``...)."""
    trace, parent, span = collective_ids(comm, seq, rank)
    attrs = {"nccl.op": op, "nccl.count": count, "nccl.datatype": "float32", "nccl.bytes": count * 4,
             "nccl.redop": "sum", "nccl.timing": "host_enqueue", "nccl.seq": seq, "nccl.comm.id": comm,
             "nccl.rank": rank, "nccl.nranks": nranks, "thread.id": 100 + rank, **(extra or {})}
    return ReadableSpan(f"nccl{op}", context=SpanContext(trace, span, False, _SAMPLED),
                        parent=SpanContext(trace, parent, True, _SAMPLED),
                        resource=resource or node(host or ("node-a" if rank < 2 else "node-b")), attributes=attrs,
                        start_time=start_ns, end_time=start_ns + dur, instrumentation_scope=SCOPE)


def root_span(seq: int, start_ns: int, *, nranks: int = 4, comm: str = COMM, dur: int = 1000,
              host: str = "node-a") -> ReadableSpan:
    """Rank 0's process's root span ``nccl <Op>`` (span id = every rank span's parent id)."""
    trace, parent, _ = collective_ids(comm, seq, 0)
    attrs = {"nccl.op": "AllReduce", "nccl.comm.id": comm, "nccl.nranks": nranks, "nccl.seq": seq,
             "nccl.count": 1024, "nccl.datatype": "float32", "nccl.bytes": 4096, "nccl.redop": "sum"}
    return ReadableSpan("nccl AllReduce", context=SpanContext(trace, parent, False, _SAMPLED), parent=None,
                        resource=node(host), attributes=attrs, start_time=start_ns, end_time=start_ns + dur,
                        instrumentation_scope=SCOPE)
