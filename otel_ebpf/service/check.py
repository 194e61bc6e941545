"""``otel-ebpf check``: what works on this host, what is missing and how to fix it.

Each check yields a row (name, status, detail, fix). ``required`` rows failing make the
command exit non-zero: without them eBPF cannot run at all. The BPF row really compiles
and loads the shared program, so a pass means the agent can load here.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Row", "render", "run_checks"]

OK, MISSING, INFO = "ok", "MISSING", "info"


@dataclass
class Row:
    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = False


def _root() -> Row:
    if os.geteuid() == 0:
        return Row("privileges", OK, "running as root", required=True)
    return Row("privileges", MISSING, f"running as uid {os.geteuid()}",
               "run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN", required=True)


def _bcc() -> Row:
    try:
        import bcc
    except ImportError:
        return Row("BCC", MISSING, "python module 'bcc' not importable",
                   "apt install python3-bpfcc; use a venv made with /usr/bin/python3 -m venv "
                   "--system-site-packages", required=True)
    return Row("BCC", OK, f"{getattr(bcc, '__version__', '?')} at {Path(bcc.__file__).parent}", required=True)


def _headers() -> Row:
    from otel_ebpf.bpf.loader import HEADERS_HINT, headers_dir

    d = headers_dir()
    if d is None:
        return Row("kernel headers", MISSING, f"none for {platform.release()}", HEADERS_HINT, required=True)
    target = os.path.realpath(d)
    note = "" if platform.release() in target else " (generic headers linked for this kernel)"
    return Row("kernel headers", OK, f"{target}{note}", required=True)


def _tracefs() -> Row:
    for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.exists(f"{d}/uprobe_events"):
            return Row("tracefs + uprobes", OK, d, required=True)
    return Row("tracefs + uprobes", MISSING, "uprobe_events not found",
               "mount -t tracefs tracefs /sys/kernel/tracing (kernel needs CONFIG_UPROBE_EVENTS)",
               required=True)


def _load() -> Row:
    try:
        from otel_ebpf.bpf.loader import COMMON_SRC, require_bpf

        bcc = require_bpf()
        b = bcc.BPF(text=COMMON_SRC.read_text(), cflags=["-DOE_FILTER_PIDS=1", '-DOE_LIB_PATTERN="libcudart.so"',
                                                          "-Wno-unused-function"])
        b.cleanup()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Row("BPF load (tracepoints, ring buffer)", MISSING, first,
                   "see the rows above; docs/troubleshooting.md lists verifier errors", required=True)
    return Row("BPF load (tracepoints, ring buffer)", OK, "compiled, verified and attached", required=True)


def _kprobes() -> Row:
    if os.path.exists("/sys/kernel/tracing/kprobe_events") or os.path.exists("/sys/kernel/debug/tracing/kprobe_events"):
        return Row("kprobes", INFO, "available (otel-ebpf does not need them)")
    return Row("kprobes", INFO, "not available (CONFIG_KPROBES off); otel-ebpf uses tracepoints and uprobes only")


def _btf() -> Row:
    if os.path.exists("/sys/kernel/btf/vmlinux"):
        return Row("BTF", OK, "/sys/kernel/btf/vmlinux")
    return Row("BTF", INFO, "no /sys/kernel/btf/vmlinux", "needed only by future fentry receivers")


def _library(key: str, label: str) -> Row:
    from otel_ebpf.host.libraries import find_libraries

    found = find_libraries(key, command=[sys.executable])
    if found:
        return Row(label, OK, ", ".join(found[:3]) + (" ..." if len(found) > 3 else ""))
    return Row(label, INFO, "not found in ldconfig or this Python's site-packages",
               "found per process at run time (/proc/PID/maps, the command's venv); or set "
               f"receivers.{'cuda' if key == 'cudart' else 'nccl'}.libraries")


def _nccl_plugin(proc: str = "/proc") -> Row:
    """Our NCCL profiler plugin built, and which running NCCL processes loaded it (GPU-side collective time)."""
    from otel_ebpf import nccl_profiler as plug
    from otel_ebpf.host.libraries import file_mappings

    label = "NCCL GPU time (profiler plugin)"
    path = plug.plugin_path()
    if path is None:
        return Row(label, INFO, f"{plug.LIBRARY_NAME} is not built",
                   "it needs gcc and sys/sdt.h (apt install systemtap-sdt-dev); reinstall otel-ebpf")
    using, loaded = [], []
    for pid in sorted(int(d) for d in os.listdir(proc) if d.isdigit())[:4096]:
        names = {os.path.basename(path) for *_, path in file_mappings(pid, proc) or ()}  # one read of its maps
        if any(n.startswith("libnccl.so") for n in names):
            using.append(pid)
            if plug.LIBRARY_NAME in names:
                loaded.append(pid)
    found = f"{path}; NCCL processes running: {len(using)}, with the plugin: {len(loaded)}"
    if len(loaded) < len(using):
        missing = ", ".join(str(p) for p in using if p not in loaded)[:200]
        return Row(label, INFO, found + f" (without: {missing})",
                   f"'otel-ebpf run' sets it; for other jobs set {plug.NCCL_ENV}={path} (docs/nccl-profiler.md)")
    return Row(label, OK, found)


def _usdt() -> Row:
    exe = "/usr/bin/python3"
    if not os.path.exists(exe) or not shutil.which("readelf"):
        return Row("Python USDT", INFO, "cannot inspect /usr/bin/python3")
    out = subprocess.run(["readelf", "-n", exe], capture_output=True, text=True, timeout=10, check=False).stdout
    if "function__entry" in out:
        return Row("Python USDT", OK, f"{exe} has function__entry/return probes")
    return Row("Python USDT", INFO, f"{exe} has no USDT probes", "use a distribution Python built with dtrace")


def _nvml() -> Row:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        drv = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        return Row("NVML (GPU metrics)", OK, f"{n} GPU(s), driver {drv}")
    except Exception as exc:
        return Row("NVML (GPU metrics)", INFO, f"unavailable: {type(exc).__name__}",
                   "needs an NVIDIA driver (libnvidia-ml.so.1); GPU metrics are skipped without it")


def _perf() -> Row:
    from otel_ebpf.receivers.perf.perfevent import hardware_unsupported

    why = hardware_unsupported()
    if why is None:
        return Row("perf counters (PMU)", OK, "hardware cycles, instructions, dTLB misses can be counted")
    return Row("perf counters (PMU)", INFO, f"not supported here: {why}",
               "receivers.perf still counts software events (task_clock, context_switches); "
               "see docs/troubleshooting.md")


CHECKS: list[Callable[[], Row]] = [_root, _bcc, _headers, _tracefs, _load, _kprobes, _btf,
                                   lambda: _library("cudart", "CUDA runtime"),
                                   lambda: _library("nccl", "NCCL"), _nccl_plugin, _usdt, _nvml, _perf]


def run_checks() -> list[Row]:
    rows = []
    for check in CHECKS:
        try:
            rows.append(check())
        except Exception as exc:  # a broken check is itself a finding
            rows.append(Row(getattr(check, "__name__", "check"), MISSING, f"check failed: {exc}"))
    return rows


def render(rows: list[Row], width: int | None = None) -> str:
    """A table: capability | status | detail, with a ``fix:`` line under every row that is not ok
    (a MISSING row without its own fix points at the troubleshooting guide). Long text wraps to
    ``width`` (default: the terminal's, at least 80)."""
    if width is None:
        width = max(shutil.get_terminal_size((100, 24)).columns, 80)
    w = max(len("capability"), *(len(r.name) for r in rows))
    sw = max(len("status"), *(len(r.status) for r in rows))
    text_w = max(width - w - sw - 6, 30)
    lines = [f"{'capability':<{w}} | {'status':<{sw}} | detail / fix", f"{'-' * w}-+-{'-' * sw}-+-{'-' * text_w}"]
    for r in rows:
        fix = r.fix or ("see docs/troubleshooting.md" if r.status == MISSING else "")
        cells = textwrap.wrap(r.detail, text_w, break_on_hyphens=False) or [""]
        if fix and r.status != OK:
            cells += textwrap.wrap(f"fix: {fix}", text_w, subsequent_indent="     ", break_on_hyphens=False)
        for i, cell in enumerate(cells):
            name, status = (r.name, r.status) if i == 0 else ("", "")
            lines.append(f"{name:<{w}} | {status:<{sw}} | {cell}".rstrip())
    bad = [r.name for r in rows if r.required and r.status != OK]
    lines.append("")
    lines.append(f"eBPF cannot run here: fix {', '.join(bad)}" if bad else "eBPF tracing can run on this host.")
    return "\n".join(lines)
