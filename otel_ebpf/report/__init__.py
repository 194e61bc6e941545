"""Offline views of OTLP JSON lines output: the self-contained HTML report and its readers.

* :func:`read_otlp_json` - ``traces.jsonl`` / ``metrics.jsonl`` -> :class:`SpanRow` / :class:`MetricPoint`.
* :func:`write_report` - one ``report.html`` (inline CSS/JS/SVG, data embedded, no network).

The Perfetto export is :mod:`otel_ebpf.report.perfetto`, Parquet is :mod:`otel_ebpf.report.parquet`.
"""
from __future__ import annotations

from otel_ebpf.report.html import render_html, write_report
from otel_ebpf.report.otlpfiles import MetricPoint, OtlpData, SpanEvent, SpanRow, decode_attributes, read_otlp_json

__all__ = ["MetricPoint", "OtlpData", "SpanEvent", "SpanRow", "decode_attributes", "read_otlp_json",
           "render_html", "write_report"]
