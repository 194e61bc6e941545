"""Write the self-contained HTML report: one file, inline CSS and JS, the data embedded as JSON.

The page needs no network: no CDN, no fonts, no images; the JS (``report.js``, a few hundred
lines of vanilla JS next to this module) draws SVG from ``<script type="application/json">``.
The JSON is escaped so that no ``</script>`` (or ``<!--``) inside span names or attributes can
end the block early. Blocking file I/O; not thread-safe for the same output path.
"""
from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from otel_ebpf.report import model
from otel_ebpf.report.otlpfiles import OtlpData, read_otlp_json

__all__ = ["render_html", "write_report"]

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{css}
</style></head>
<body>
<h1>{title}</h1>
<div id="summary"></div>
<p id="files"></p>
<h2>Timeline</h2>
<p class="muted">One lane per process (its rank when it has one): its lifetime is the bracket in the lane's header
(fork to exit), and each thread has a row per source: Python calls, torch operators, CUDA calls, NCCL calls; a call
nested in another is drawn below it. Jobs with NCCL collectives get a top lane of the collectives joined across ranks
(green; orange = partial, dashed line and &#9660; = desync), <b style="color:#d62728">red</b> = the last rank to
arrive at that collective (the straggler); the lane of the most frequent straggler is shaded.</p>
<p id="span-note"></p>
<div id="tl-box"><svg id="timeline" xmlns="http://www.w3.org/2000/svg"></svg></div>
<div id="metrics"></div>
<h2>Top slowest calls</h2>
<table id="slow"></table>
<section id="sec-skew"><h2>Collectives by skew (first to last rank arrival)</h2>
<table id="skew"></table></section>
<section id="sec-hangs"><h2>Hangs and stragglers</h2>
<p class="muted">Desync reports with what each missing rank was doing, persistent stragglers raised and cleared (the
gateway's), and silent ranks' live stacks (the agents'): log records, newest last. Click a row for its stack.</p>
<div id="forensics"></div></section>
<div id="tip"></div>
<script type="application/json" id="oe-data">{data}</script>
<script>
{js}
</script>
</body></html>
"""


def _asset(name: str) -> str:
    return resources.files("otel_ebpf.report").joinpath(name).read_text(encoding="utf-8")


def _embed(data: Any) -> str:
    """JSON safe inside a <script> element (HTML spec: no '</' or '<!--' sequences)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(data: OtlpData, *, title: str = "otel-ebpf report", max_spans: int = model.DEFAULT_MAX_SPANS,
                top: int = 25) -> str:
    """The report page for ``data`` (see :mod:`otel_ebpf.report.model` for what it shows)."""
    built = model.build(data, max_spans=max_spans, top=top, title=title)
    return _PAGE.format(title=html.escape(title), css=_asset("report.css"), js=_asset("report.js"),
                        data=_embed(built))


def write_report(source: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *,
                 title: str | None = None, max_spans: int = model.DEFAULT_MAX_SPANS, top: int = 25) -> Path:
    """Read the OTLP JSON lines under ``source`` (a directory or one file) and write the report to
    ``output`` (default ``<source dir>/report.html``). Returns the path written. Raises
    FileNotFoundError when ``source`` does not exist, OSError when the output cannot be written."""
    src = Path(source)
    data = read_otlp_json(src)
    out = Path(output) if output else (src if src.is_dir() else src.parent) / "report.html"
    page = render_html(data, title=title or f"otel-ebpf report: {src.resolve().name}", max_spans=max_spans, top=top)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
