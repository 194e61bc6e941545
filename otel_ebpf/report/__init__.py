"""Offline views of OTLP JSON lines output: the self-contained HTML report and its readers.

* :func:`read_otlp_json` - ``traces.jsonl`` / ``metrics.jsonl`` -> :class:`SpanRow` / :class:`MetricPoint`.
* :func:`write_report` - one ``report.html`` (inline CSS/JS/SVG, data embedded, no network).

The Perfetto export is :mod:`otel_ebpf.report.perfetto`, Parquet is :mod:`otel_ebpf.report.parquet`.
The names load on first use (PEP 562): every ``otel-ebpf`` command imports the ``report`` subcommand's
parser (:mod:`otel_ebpf.report.cli`), and the renderer is ~25 ms of imports a ``run`` does not need.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_ebpf.report.html import render_html, write_report
    from otel_ebpf.report.otlpfiles import (
        MetricPoint,
        OtlpData,
        SpanEvent,
        SpanRow,
        decode_attributes,
        read_otlp_json,
    )

__all__ = ["MetricPoint", "OtlpData", "SpanEvent", "SpanRow", "decode_attributes", "read_otlp_json",
           "render_html", "write_report"]
_WHERE = {"render_html": "html", "write_report": "html", **{n: "otlpfiles" for n in __all__[:6]}}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
