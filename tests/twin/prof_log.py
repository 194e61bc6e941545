"""What the recording profiler plugin (tests/twin/prof_plugin.c) wrote, read back for tests/twin/test_nccl_profiler.py:
one :class:`Log` per rank process, its records in call order, events by id, and the steps the program timed
(tests/twin/programs/prof_ops.py)."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ebpf.twin.build import PLUGIN_INCLUDE

__all__ = ["KIND", "Log", "build_plugin", "read_logs"]

# ncclProfile* event types (NCCL 2.28.9 src/include/plugin/nccl_profiler.h) by the names the tests use
KIND = {256: "GroupApi", 512: "CollApi", 1024: "P2pApi", 2048: "KernelLaunch", 1: "Group", 2: "Coll", 4: "P2p",
        64: "KernelCh"}
PLUGIN_SOURCE = Path(__file__).resolve().parent / "prof_plugin.c"


def build_plugin(out: Path, *flags: str) -> Path:
    """prof_plugin.c as a shared library at ``out``, against the plugin headers the twin vendors."""
    subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", f"-I{PLUGIN_INCLUDE}", *flags,
                    "-o", str(out), str(PLUGIN_SOURCE), "-lpthread"], check=True, capture_output=True, timeout=120)
    return out


@dataclass
class Log:
    """One process's calls. ``starts``: id -> start record (with ``kind``); ``stops``/``records``: id -> the stop /
    recordEventState records of it, in order; ``steps``: the program's step name -> (epoch ns before, after)."""

    rank: int
    pid: int
    calls: list[dict[str, Any]]
    steps: dict[str, tuple[int, int]]
    found: dict[str, Any]
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)
    stops: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, c in enumerate(self.calls):
            c["at"] = i
            if c["call"] == "start":
                c["kind"] = KIND.get(c["type"], str(c["type"]))
                self.starts[c["id"]] = c
            elif c["call"] == "stop":
                self.stops.setdefault(c["id"], []).append(c)
            elif c["call"] == "record":
                self.records.setdefault(c["id"], []).append(c)

    @property
    def inits(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["call"] == "init"]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["call"] == "start" and c["kind"] == kind]

    def children(self, parent: int, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.of(kind) if c["parent"] == parent]

    def kind_of(self, event_id: int) -> str:
        return self.starts[event_id]["kind"] if event_id in self.starts else "?"

    def sequence(self, step: str, tid: int | None = None) -> list[str]:
        """The calls of thread ``tid`` (default: the main thread) while ``step`` ran: "+Kind" for a start, "-Kind"
        for a stop, "@state" for a recordEventState."""
        lo, hi = self.steps[step]
        tid = self.pid if tid is None else tid
        seq = []
        for c in self.calls:
            if c["tid"] != tid or not lo <= c["ns"] <= hi or c["call"] in ("init", "finalize"):
                continue
            if c["call"] == "start":
                seq.append("+" + c["kind"])
            elif c["call"] == "stop":
                seq.append("-" + self.kind_of(c["id"]))
            else:
                seq.append(f"@{c['state']}")
        return seq

    def in_step(self, step: str, kind: str) -> list[dict[str, Any]]:
        lo, hi = self.steps[step]
        return [c for c in self.of(kind) if lo <= c["ns"] <= hi]


def read_logs(out: Path, nranks: int) -> list[Log]:
    """Each rank's Log: its ``rank<N>.json`` and the plugin's ``prof-<pid>.jsonl``."""
    logs = []
    for r in range(nranks):
        found = json.loads((out / f"rank{r}.json").read_text())
        path = out / f"prof-{found['pid']}.jsonl"
        calls = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        logs.append(Log(r, found["pid"], calls, {s[0]: (s[1], s[2]) for s in found["steps"]}, found))
    return logs
