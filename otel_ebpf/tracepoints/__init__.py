"""Application tracepoints: named probe points an application fires, which cost next to
nothing until a tracer (the otel-ebpf agent's ``apptrace`` receiver, bpftrace, perf) attaches.

::

    from otel_ebpf import tracepoints
    tp = tracepoints.Provider("mlserver")
    model_loaded = tp.probe("model_loaded", model=str, version=int)

    if model_loaded.enabled:                      # one C call reading a USDT semaphore
        model_loaded.fire(model=name, version=v)  # arguments computed only when traced
    model_loaded.fire(model=lambda: expensive())  # or lazily: callables run only when traced

    with tp.span("batch_formed", size=len(batch)):  # begin/end pair; GPU/kernel spans of this
        run_batch(batch)                            # thread become its children in the agent

Mechanism: the C extension :mod:`otel_ebpf.tracepoints._oetp` holds one USDT probe,
``otel_ebpf:event`` (argument list in ``_oetp.c``), with a semaphore. A tracer that attaches
increments the semaphore; ``enabled`` reads it. Fires carry the caller's current OpenTelemetry
trace context (``trace_id``, ``span_id``), so what the agent sees around the event lands in
the application's trace. A :meth:`Provider.span` that fires also makes its span current in
the app (a non-recording span with the same ids), so spans the app starts inside nest under it.

Contract: nothing here raises into the application after declaration. A fire with an
undeclared argument, a wrong type or a failing callable drops that argument and counts it in
:data:`stats`; payloads are bounded (:data:`MAX_PAYLOAD` bytes of JSON, strings cut at
:data:`MAX_STR` characters). Without the extension (not built), every probe is disabled.
Thread-safe: fires keep no shared state except the counters.
"""
from __future__ import annotations

import importlib
import json
import random
import re
from collections.abc import Callable
from typing import Any

__all__ = ["AVAILABLE", "KIND_BEGIN", "KIND_END", "KIND_POINT", "MAX_PAYLOAD", "MAX_STR", "Probe", "Provider",
           "enabled", "stats"]

try:
    _oetp: Any = importlib.import_module("otel_ebpf.tracepoints._oetp")

    AVAILABLE = True
    _enabled: Callable[[], bool] = _oetp.enabled
    _fire: Callable[..., None] = _oetp.fire
except ImportError:  # extension not built: every probe stays off
    AVAILABLE = False

    def _enabled() -> bool:
        return False

    def _fire(*_args: Any) -> None:
        return None

KIND_POINT, KIND_BEGIN, KIND_END = 0, 1, 2
MAX_PAYLOAD = 255  # bytes of JSON; the agent reads 256 with the NUL
MAX_STR = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,30}")
_TYPES = (str, int, float, bool)
stats: dict[str, int] = {"fires": 0, "dropped_args": 0, "truncated": 0}


def enabled() -> bool:
    """True while any tracer is attached to ``otel_ebpf:event``."""
    return _enabled()


def _context() -> tuple[int, int]:
    """(trace_id, span_id) of the caller's current OpenTelemetry span, (0, 0) without one."""
    try:
        from opentelemetry import trace
    except ImportError:
        return 0, 0
    sc = trace.get_current_span().get_span_context()
    return (sc.trace_id, sc.span_id) if sc.is_valid else (0, 0)


class Probe:
    """A declared probe point. ``enabled`` costs one C call; ``fire`` returns at once when
    nothing is attached. Argument types are str, int, float or bool."""

    __slots__ = ("_bname", "_bprovider", "_types", "name", "provider")

    def __init__(self, provider: str, name: str, types: dict[str, type]) -> None:
        for key in (provider, name, *types):
            if not _NAME.fullmatch(key):
                raise ValueError(f"tracepoint names must be identifiers of at most 31 characters, got {key!r}")
        for key, tp in types.items():
            if tp not in _TYPES:
                raise TypeError(f"argument {key} of {provider}.{name}: type must be str, int, float or bool")
        self.provider, self.name, self._types = provider, name, dict(types)
        self._bprovider, self._bname = provider.encode(), name.encode()

    @property
    def enabled(self) -> bool:
        return _enabled()

    def fire(self, **args: Any) -> None:
        """Fire a point event with the declared arguments (callables are called now)."""
        if not _enabled():
            return
        trace_id, span_id = _context()
        self._emit(KIND_POINT, trace_id, span_id, 0, args)

    def _emit(self, kind: int, trace_id: int, parent: int, span: int, args: dict[str, Any]) -> None:
        stats["fires"] += 1
        _fire(kind, self._bprovider, self._bname, trace_id >> 64, trace_id & 0xFFFFFFFFFFFFFFFF, parent, span,
              self._payload(args))

    def _payload(self, args: dict[str, Any]) -> bytes:
        clean: dict[str, Any] = {}
        for key, value in args.items():
            tp = self._types.get(key)
            try:
                if callable(value):
                    value = value()
                if tp is None or not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
                    raise TypeError(key)
            except Exception:  # the app must never fail because it is traced
                stats["dropped_args"] += 1
                continue
            clean[key] = value[:MAX_STR] if isinstance(value, str) else value
        data = json.dumps(clean, separators=(",", ":"), ensure_ascii=True).encode()
        while len(data) > MAX_PAYLOAD and clean:  # drop arguments from the end until it fits
            clean.popitem()
            stats["truncated"] += 1
            data = json.dumps({**clean, "_truncated": True}, separators=(",", ":"), ensure_ascii=True).encode()
        return data

class Provider:
    """A named set of probes (``provider`` in the spans the agent makes: app.tracepoint.provider)."""

    def __init__(self, name: str) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"provider name must be an identifier of at most 31 characters, got {name!r}")
        self.name = name
        self._spans: dict[str, Probe] = {}

    def probe(self, name: str, **types: type) -> Probe:
        """Declare a point probe with typed arguments, e.g. ``probe("model_loaded", model=str)``."""
        return Probe(self.name, name, types)

    def span(self, name: str, **args: Any) -> _Scope | _NoScope:
        """A begin/end pair around a ``with`` block. When traced: the span gets the caller's
        trace (or a new one), a fresh span id, and is current in the app inside the block.
        Argument types are taken from the first use; callables are called once, at the begin.
        Not traced: a shared no-op context manager (no allocation)."""
        if not _enabled():
            return _NOOP
        values: dict[str, Any] = {}
        for key, value in args.items():
            try:
                values[key] = value() if callable(value) else value
            except Exception:  # the app must never fail because it is traced
                stats["dropped_args"] += 1
        probe = self._spans.get(name)
        if probe is None:
            probe = self._spans[name] = Probe(self.name, name, {k: type(v) for k, v in values.items()
                                                                if type(v) in _TYPES and _NAME.fullmatch(k)})
        return _Scope(probe, values)


class _NoScope:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


_NOOP = _NoScope()


class _Scope:
    """One traced span: begin at ``__enter__``, end at ``__exit__`` (same thread)."""

    __slots__ = ("_ids", "_probe", "_token", "_values")

    def __init__(self, probe: Probe, values: dict[str, Any]) -> None:
        self._probe, self._values = probe, values
        self._ids = (0, 0, 0)
        self._token: object | None = None

    def __enter__(self) -> None:
        trace_id, parent = _context()
        trace_id = trace_id or random.getrandbits(128) or 1
        span_id = random.getrandbits(64) or 1
        self._ids = (trace_id, parent, span_id)
        self._probe._emit(KIND_BEGIN, trace_id, parent, span_id, self._values)
        self._token = _activate(trace_id, span_id)

    def __exit__(self, *_exc: object) -> None:
        _deactivate(self._token)
        trace_id, parent, span_id = self._ids
        self._probe._emit(KIND_END, trace_id, parent, span_id, {})


def _activate(trace_id: int, span_id: int) -> object | None:
    try:
        from opentelemetry import context, trace
    except ImportError:
        return None
    sc = trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(1))
    return context.attach(trace.set_span_in_context(trace.NonRecordingSpan(sc)))


def _deactivate(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]
