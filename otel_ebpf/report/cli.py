"""The ``otel-ebpf report`` and ``otel-ebpf export`` subcommands (hooked into otel_ebpf.cli).

::

    otel-ebpf report DIR [-o report.html] [--perfetto trace.json] [--max-spans N]
    otel-ebpf export --parquet OUTDIR DIR

Exit codes: 0 written; 1 the input does not exist or an output cannot be written; 2 bad
options. Missing pyarrow is reported with the install hint.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_ebpf.core.errors import ConfigError, OtelEbpfError

__all__ = ["COMMANDS", "add_parsers", "run"]

COMMANDS = ("report", "export")

REPORT_EXAMPLES = """examples:
  otel-ebpf report ./otel-ebpf-out
      ./otel-ebpf-out/report.html: a timeline per process and thread (Python, torch, CUDA, NCCL rows;
      collectives and the straggler in red for NCCL jobs), metric charts (GPU/CUDA/NCCL, PyTorch,
      process, host), the slowest calls; one self-contained file, open it in any browser, offline
  otel-ebpf report ./otel-ebpf-demo-out -o /tmp/job.html --perfetto /tmp/job.trace.json
      also a Chrome Trace Event Format file: open it in https://ui.perfetto.dev or chrome://tracing
"""

EXPORT_EXAMPLES = """examples:
  otel-ebpf export --parquet ./tables ./otel-ebpf-out
      ./tables/spans.parquet and ./tables/metrics.parquet (schema: docs/analysis.md), then in Python:
      polars.read_parquet("tables/spans.parquet").group_by("name").agg(polars.col("duration_ns").sum())
"""


def add_parsers(sub: Any) -> None:
    """Add ``report`` and ``export`` to the main parser's subparsers."""
    rep = sub.add_parser("report", help="a self-contained HTML report (and a Perfetto trace) from OTLP JSON lines",
                         description="Reads DIR/traces.jsonl and DIR/metrics.jsonl (what 'run --output DIR', "
                                     "'gateway --output DIR' and 'demo' write) and writes one HTML file with "
                                     "inline CSS/JS/SVG: it needs no network to open.",
                         epilog=REPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("source", metavar="DIR", help="directory with traces.jsonl / metrics.jsonl (or one .jsonl file)")
    rep.add_argument("-o", "--output", metavar="FILE", help="the HTML file (default DIR/report.html)")
    rep.add_argument("--perfetto", metavar="FILE", help="also write Chrome Trace Event Format JSON here")
    rep.add_argument("--max-spans", type=int, metavar="N", default=20_000,
                     help="most spans drawn on the timeline (default 20000; collective spans first)")
    exp = sub.add_parser("export", help="OTLP JSON lines to Parquet tables for polars / pandas",
                         epilog=EXPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    exp.add_argument("--parquet", metavar="OUTDIR", required=True, help="write spans.parquet and metrics.parquet here")
    exp.add_argument("source", metavar="DIR", help="directory with traces.jsonl / metrics.jsonl (or one .jsonl file)")


def _report(args: argparse.Namespace) -> int:
    from otel_ebpf.report.perfetto import write_chrome_trace
    from otel_ebpf.report import write_report

    if args.max_spans < 1:
        raise ConfigError("--max-spans", f"must be at least 1, got {args.max_spans}")
    out = write_report(args.source, args.output, max_spans=args.max_spans)
    print(f"report: {out}")
    if args.perfetto:
        print(f"perfetto trace: {write_chrome_trace(args.source, args.perfetto)} (open in https://ui.perfetto.dev)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from otel_ebpf.report.parquet import write_otlp_parquet

    for name, path in write_otlp_parquet(args.source, args.parquet).items():
        print(f"{name}: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``report`` or ``export``; OSError (a missing input, an unwritable output) becomes OtelEbpfError."""
    try:
        return _report(args) if args.cmd == "report" else _export(args)
    except FileNotFoundError as exc:
        raise OtelEbpfError(str(exc.args[0]) if exc.args else str(exc)) from None
    except OSError as exc:
        raise OtelEbpfError(f"cannot write {exc.filename or ''}: {exc.strerror or exc}") from None


def main(argv: list[str] | None = None) -> int:  # python -m otel_ebpf.report.cli (without the main CLI)
    p = argparse.ArgumentParser(prog="otel-ebpf")
    add_parsers(p.add_subparsers(dest="cmd", required=True))
    try:
        return run(p.parse_args(argv))
    except OtelEbpfError as exc:
        print(f"otel-ebpf: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
