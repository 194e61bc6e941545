"""Hang-forensics lines for the demo's closing summary, read back from the gateway's ``logs.jsonl`` (OTLP/JSON
lines, as the file exporter writes them): what a desync's missing ranks were doing and persistent stragglers
(processors/collective_join/hangs.py, stragglers.py). Pure functions; no OTel SDK."""
from __future__ import annotations

import json
from pathlib import Path

from otel_ebpf.report.otlpfiles import decode_attributes

__all__ = ["read_hangs"]


def read_hangs(logs: str | Path, limit: int = 8) -> list[str]:
    """One line per hang-forensics record of the gateway's ``logs.jsonl`` (what a desync's missing ranks were
    doing; persistent stragglers raised and cleared), oldest first, at most ``limit``; a missing file gives none."""
    lines: list[str] = []
    try:
        text = Path(logs).read_text()
    except OSError:
        return lines
    for raw in text.splitlines():
        try:
            records = [r for rl in json.loads(raw).get("resourceLogs", []) for sl in rl.get("scopeLogs", [])
                       for r in sl.get("logRecords", [])]
        except (ValueError, AttributeError):
            continue
        for r in records:
            a = decode_attributes(r.get("attributes", []))
            if r.get("eventName") == "otel_ebpf.nccl.desync" and a.get("nccl.missing.functions"):
                where = "; ".join(f"rank {rank} is in {f}, silent {ms / 1e3:.0f}s" for rank, f, ms in zip(
                    a.get("nccl.missing.stack_ranks", ()), a["nccl.missing.functions"],
                    a.get("nccl.missing.silence_ms", ()), strict=False))
                lines.append(f"hang: {a.get('nccl.op')} seq {a.get('nccl.seq')} of comm {a.get('nccl.comm.id')}: "
                             f"{where}")
            elif r.get("eventName") == "otel_ebpf.nccl.straggler":
                gpu = a.get("nccl.straggler.kind") == "gpu"  # slow on the GPU, its host on time
                share = a.get("nccl.straggler.gpu.share" if gpu else "nccl.straggler.share", 0)
                lines.append(f"persistent {'GPU ' if gpu else ''}straggler {a.get('nccl.straggler.state')}: rank "
                             f"{a.get('nccl.rank')} on {a.get('host.name', '?')} (comm {a.get('nccl.comm.id')}, "
                             f"{'kernel last in' if gpu else 'share'} {float(share):.0%})")
    return lines[:limit]
