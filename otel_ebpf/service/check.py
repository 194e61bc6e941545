"""``otel-ebpf check``: what works on this host, what is missing and how to fix it.

Each check yields a row (name, status, detail, fix). ``required`` rows failing make the
command exit non-zero: without them eBPF cannot run at all. The BPF row really compiles
and loads the shared program, so a pass means the agent can load here. A row that fails only
because another does (a mounted tracefs a non-root user cannot read, a BPF load the kernel
refuses for want of privileges) names that row as its ``cause``, so the advice is the real fix
(run as root / grant the capabilities), not a mount that is already there.
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

from otel_ebpf.core.errors import PrivilegeError

__all__ = ["CAPS", "Row", "missing_caps", "render", "run_checks", "tracefs_mounts", "verdict"]

OK, MISSING, INFO = "ok", "MISSING", "info"


@dataclass
class Row:
    """``cause``: the name of the row whose fix also fixes this one (a tracefs the user cannot read
    because they are not root): the verdict names the cause, not each of its consequences."""

    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = False
    cause: str = ""


PRIVILEGES = "privileges"
# linux/capability.h: CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39 (the last two since Linux 5.8)
CAPS = {"CAP_BPF": 39, "CAP_PERFMON": 38, "CAP_SYS_ADMIN": 21}
PRIVILEGES_FIX = ("run it as root (sudo otel-ebpf ...), or grant CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN "
                  "(docker run --cap-add, a Kubernetes securityContext)")


def missing_caps(status: str = "/proc/self/status") -> list[str]:
    """The capabilities of :data:`CAPS` this process lacks in its effective set (all of them when
    ``status`` cannot be read)."""
    try:
        with open(status, encoding="ascii") as fh:
            eff = next((int(ln.split()[1], 16) for ln in fh if ln.startswith("CapEff:")), 0)
    except (OSError, ValueError, IndexError):
        eff = 0
    return [name for name, bit in CAPS.items() if not eff >> bit & 1]


def _root() -> Row:
    if os.geteuid() == 0:
        return Row(PRIVILEGES, OK, "running as root", required=True)
    missing = missing_caps()
    if not missing:
        return Row(PRIVILEGES, OK, f"uid {os.geteuid()} with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN", required=True)
    return Row(PRIVILEGES, MISSING, f"not root (uid {os.geteuid()}) and missing {', '.join(missing)}: the kernel "
               "refuses to load eBPF programs without them", PRIVILEGES_FIX, required=True)


def _privileged() -> bool:
    return os.geteuid() == 0 or not missing_caps()


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


def tracefs_mounts(mounts: str = "/proc/self/mounts") -> list[str]:
    """Where tracefs is mounted (readable by anyone, unlike tracefs itself)."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as fh:
            return [parts[1] for parts in (ln.split() for ln in fh) if len(parts) > 2 and parts[2] == "tracefs"]
    except OSError:
        return []


def _tracefs() -> Row:
    label = "tracefs + uprobes"
    dirs = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
    for d in dirs:
        if os.path.exists(f"{d}/uprobe_events"):
            return Row(label, OK, d, required=True)
    mounted = [d for d in tracefs_mounts() if d in dirs]
    if mounted and not os.access(mounted[0], os.R_OK | os.X_OK):
        # tracefs is there, this user just may not look inside (mode 0700, root's): the fault is privileges
        if _privileged():  # capabilities, not root: tracefs's owner still keeps others out
            return Row(label, MISSING, f"{mounted[0]} is mounted but uid {os.geteuid()} cannot read it",
                       "not a mount problem: run it as root", required=True)
        return Row(label, MISSING, f"{mounted[0]} is mounted but only root can read it",
                   f"not a mount problem: see '{PRIVILEGES}'", required=True, cause=PRIVILEGES)
    if mounted:
        return Row(label, MISSING, f"{mounted[0]} has no uprobe_events",
                   "the kernel needs CONFIG_UPROBE_EVENTS=y", required=True)
    return Row(label, MISSING, "tracefs is not mounted",
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
        if isinstance(exc, PrivilegeError) or not _privileged():
            return Row("BPF load (tracepoints, ring buffer)", MISSING, first, f"see '{PRIVILEGES}'", required=True,
                       cause=PRIVILEGES)
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
    """One row, whatever the host: the GPUs NVML reads; or, with no NVIDIA GPU on the PCI bus,
    that NVML metrics are off (nothing to fix); or, with one, why NVML cannot read it (a fault)."""
    from otel_ebpf.host.nvml import load
    from otel_ebpf.receivers.nvml.presence import NO_GPU, nvidia_gpus

    label = "NVML (GPU metrics)"
    nv, why = load()
    if nv is not None:
        try:
            return Row(label, OK, f"{nv.nvmlDeviceGetCount()} GPU(s), driver {nv.nvmlSystemGetDriverVersion()}")
        finally:
            nv.nvmlShutdown()
    on_pci = nvidia_gpus()
    if not on_pci:
        return Row(label, INFO, f"{NO_GPU}: {why}")
    return Row(label, MISSING, f"{len(on_pci)} NVIDIA GPU(s) on the PCI bus ({', '.join(on_pci[:3])}) but no GPU "
               f"metrics: {why}", "install and load the NVIDIA driver; in a container, mount the driver's "
               "libnvidia-ml.so.1 (or set receivers.nvml.library)")


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
    lines.append("")
    lines.append(verdict(rows))
    return "\n".join(lines)


def verdict(rows: list[Row]) -> str:
    """The last line: the required rows to fix, each cause once, with what follows from it."""
    bad = [r for r in rows if r.required and r.status != OK]
    if not bad:
        return "eBPF tracing can run on this host."
    causes = [r.name for r in bad if not r.cause]
    fix = [*causes, *(r.name for r in bad if r.cause and r.cause not in causes)]
    line = f"eBPF cannot run here: fix {', '.join(fix)}"
    for name in causes:
        follow = [r.name for r in bad if r.cause == name]
        if follow:
            line += f"; {' and '.join(follow)} {'fails' if len(follow) == 1 else 'fail'} because of {name}"
    return line
