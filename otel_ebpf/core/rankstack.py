"""The agent/gateway contract of a silent rank's stack record (issue 17), below both sides.

The agent's ``nccl_watch`` processor (otel_ebpf/processors/nccl_watch) emits, for a process that made no
NCCL call for longer than its threshold, one :class:`~otel_ebpf.core.events.LogRecord` per communicator it
had used, all sharing one stack capture: event name :data:`RANK_STACK_EVENT`, severity WARN, body the text
stack (or, without one, why not), on the rank process's resource. A gateway finds "the stack of rank R of
communicator C" by (``nccl.comm.id``, ``nccl.rank``) and the latest ``time_ns``.

Attributes (:data:`RANK_STACK_ATTRIBUTES`; those in parentheses only when known):

* ``nccl.comm.id``, (``nccl.rank``), (``nccl.nranks``): the communicator and this process's rank in it;
* (``nccl.seq``), ``nccl.op``: its last call on that communicator (a split child's rank may be unknown here);
* ``nccl.silence_ms``: ms since that call ended; ``nccl.silence.threshold_ms``: the process's threshold;
* ``otel_ebpf.stack.outcome``: ok, not_python, permission, timeout, missing, busy, error
  (otel_ebpf.host.stacks; an exited process gets no record);
* ``otel_ebpf.stack.threads``, ``otel_ebpf.stack.truncated``, ``otel_ebpf.stack.capture_ms``;
* (``code.function.name``, ``code.file.path``, ``code.line.number``): the main thread's innermost Python frame
  (OTel semconv ``code.*``, stable since semconv 1.30).
"""
from __future__ import annotations

__all__ = ["RANK_STACK_ATTRIBUTES", "RANK_STACK_EVENT"]

RANK_STACK_EVENT = "otel_ebpf.nccl.rank.stack"
RANK_STACK_ATTRIBUTES = ("nccl.comm.id", "nccl.rank", "nccl.nranks", "nccl.seq", "nccl.op", "nccl.silence_ms",
                         "nccl.silence.threshold_ms", "otel_ebpf.stack.outcome", "otel_ebpf.stack.threads",
                         "otel_ebpf.stack.truncated", "otel_ebpf.stack.capture_ms", "code.function.name",
                         "code.file.path", "code.line.number")
