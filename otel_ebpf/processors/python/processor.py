"""Python calls (otel_ebpf/receivers/python) -> spans; everything else passes unchanged.

One span per :class:`PythonCall` (scope ``otel_ebpf.python``), named ``<module>.<function>``
(``workload.slow``: the module is the file's stem, or its folder for ``__init__.py``).
Attributes (semconv): ``code.function.name`` (the same qualified name), ``code.file.path``,
``code.line.number`` (line at entry), ``thread.id``; and ``python.call.depth`` (frames below
it on the thread's stack since the probes attached).

Nesting needs no buffering: the receiver names each call's nearest enclosing recorded call
and outermost one by their start times (unique per thread), so span ids are derived here:
``span_id = H(pid, tid, start)``, ``parent_span_id = H(pid, tid, parent_start)``,
``trace_id = H(pid, tid, root_start)``: a parent that returns later gets the id its children
already point at. A recorded child's parent lasted longer, so it passes the duration filter;
it is missing only when it had not returned when the probes detached.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

import os

from opentelemetry.semconv.attributes.code_attributes import CODE_FILE_PATH, CODE_FUNCTION_NAME, CODE_LINE_NUMBER

from otel_ebpf.core.ids import call_ids
from otel_ebpf.core.events import Attributes, SpanRecord
from otel_ebpf.core.processing import EventProcessor, handles

from ...receivers.python.events import PythonCall
from .config import Config

__all__ = ["SCOPE", "PythonProcessor", "qualified_name"]

SCOPE = "otel_ebpf.python"


def qualified_name(file: str, function: str) -> str:
    """``/app/train.py``, ``step`` -> ``train.step``; ``.../pkg/__init__.py`` -> ``pkg.f``;
    ``<string>``, ``<frozen importlib._bootstrap>`` -> the function alone."""
    if not file or file.startswith("<"):
        return function
    stem = os.path.splitext(os.path.basename(file))[0]
    if stem == "__init__":
        stem = os.path.basename(os.path.dirname(file)) or stem
    return f"{stem}.{function}" if stem else function


class PythonProcessor(EventProcessor[Config]):
    """Processor ``python``: PythonCall -> SpanRecord with derived ids."""

    NAME = "python"
    SCOPE = SCOPE

    @handles(PythonCall)
    def _call(self, ev: PythonCall, out: list[object]) -> None:
        out.append(self.span(ev))

    def span(self, ev: PythonCall) -> SpanRecord:
        name = qualified_name(ev.file, ev.function) if self.config.qualify else ev.function
        attrs: Attributes = {CODE_FUNCTION_NAME: name, CODE_FILE_PATH: ev.file, CODE_LINE_NUMBER: ev.line,
                 "thread.id": ev.tid, "python.call.depth": ev.depth}
        trace_id, span_id = call_ids(ev.pid, ev.tid, ev.start_ns, ev.root_start)
        parent = call_ids(ev.pid, ev.tid, ev.parent_start, ev.root_start)[1] if ev.parent_start else None
        return SpanRecord(ev.pid, name, ev.start_ns, ev.end_ns, attrs, scope=SCOPE,
                          trace_id=trace_id, span_id=span_id, parent_span_id=parent)
