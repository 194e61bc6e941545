"""The uprobe_multi links a process holds (otel_ebpf.bpf.links), read from /proc/PID/fdinfo as the kernel prints
them (kernel/trace/bpf_trace.c ``bpf_uprobe_multi_show_fdinfo``: ``link_type``, ``path``, then one
``cookie offset ref_ctr_offset`` row per uprobe)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["UprobeLink", "uprobe_links"]


@dataclass(frozen=True)
class UprobeLink:
    path: str
    ret: bool  # a uretprobe_multi link
    offsets: tuple[int, ...]
    ref_ctr_offsets: tuple[int, ...]


def uprobe_links(pid: int | None = None) -> list[UprobeLink]:
    """Every uprobe or uretprobe link ``pid`` (default: this process) holds; empty when it is gone."""
    pid = os.getpid() if pid is None else pid
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        kind = re.search(r"^link_type:\s+(u(?:ret)?probe_multi)$", info, re.M)
        path = re.search(r"^path:\s+(.+)$", info, re.M)
        if kind is None or path is None:
            continue
        rows = re.findall(r"^\d+\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)$", info, re.M)
        out.append(UprobeLink(path.group(1), kind.group(1) == "uretprobe_multi",
                              tuple(int(o, 16) for o, _ in rows), tuple(int(r, 16) for _, r in rows)))
    return out
