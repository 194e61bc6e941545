"""Typed event of the user-declared probes receiver.

One kind: :class:`ProbeHit`, a probe fired (``start_ns == end_ns``) or a call completed
(``span``: entry at ``start_ns``, return at ``end_ns``). Times are Unix epoch ns. ``args``
are (name, value) pairs in declaration order: int for integer types (signed per the declared
type), bool, str for ``pointer`` (hex) and ``str[N]``. ``metric`` and ``value`` repeat the
entry's output settings so the processor needs no config of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["ProbeHit"]


@fast_init
@dataclass(frozen=True, slots=True)
class ProbeHit:
    pid: int
    tid: int
    probe: str
    kind: str
    start_ns: int
    end_ns: int
    span: bool
    args: tuple[tuple[str, int | bool | str], ...]
    metric: str = "count"
    value: str = ""
