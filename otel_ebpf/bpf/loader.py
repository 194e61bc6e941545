"""Loading BCC programs: environment checks (root, BCC, kernel headers), compilation with the
compiler's output captured, retries of a load a pending signal interrupted, and the release
of what loaded programs hold (probes, without waiting at exit; the compiler's memory).

Used by :class:`otel_ebpf.bpf.receiver.BpfReceiver` and by whoever starts receivers
(:func:`programs_loaded`). Thread safety: :func:`capture_stderr` swaps the process-wide fd 2,
so one compilation at a time per process (receivers start one after another).
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import platform
import select
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from otel_ebpf.bpf import pauseguard, threadctx
from otel_ebpf.core.errors import BccMissingError, KernelHeadersError, PrivilegeError
from otel_ebpf.core.pipeline import Context

__all__ = ["COMMON_SRC", "HEADERS_HINT", "INCLUDE_DIR", "LOAD_ATTEMPTS", "all_pids", "capture_stderr",
           "hand_off_probes", "headers_dir", "import_bcc", "owned_program", "programs_loaded",
           "release_uprobes_in_background", "require_bpf", "retry_interrupted_load"]

log = logging.getLogger(__name__)
T = TypeVar("T")
INCLUDE_DIR = Path(__file__).parent / "include"
COMMON_SRC = INCLUDE_DIR / "common.bpf.c"
LOAD_ATTEMPTS = 3  # tries of a BPF program load that a pending signal interrupted (EAGAIN)

HEADERS_HINT = ("install the headers of the running kernel (Debian/Ubuntu: apt install "
                "linux-headers-$(uname -r)); when the distribution has none for this kernel, install "
                "the generic ones (linux-headers-amd64) and link them: ln -s /usr/src/linux-headers-X-amd64 "
                "/lib/modules/$(uname -r)/build; ln -s /usr/src/linux-headers-X-common "
                "/lib/modules/$(uname -r)/source  (scripts/setup.sh does this)")


def import_bcc() -> Any:
    """The ``bcc`` module, or BccMissingError explaining where BCC lives."""
    try:
        import bcc
    except ImportError:
        raise BccMissingError(
            "the BCC Python module is not importable from this interpreter",
            hint="install python3-bpfcc (apt) and run otel-ebpf from a venv made with "
                 "/usr/bin/python3 -m venv --system-site-packages (PyPI's 'bcc' is an unrelated package)",
        ) from None
    if not isinstance(getattr(bcc, "atexit", None), _BccAtexit):
        bcc.atexit = _BccAtexit()  # the name bcc/__init__.py looks up when a BPF object registers its cleanup
    return bcc


_owning = threading.local()  # .depth > 0 while this thread builds a program whose cleanup its owner runs


class _BccAtexit:
    """Stands for the ``atexit`` module inside ``bcc``: registers what BCC registers, except the cleanup of a
    program built under :func:`owned_program`. BCC 0.26's ``BPF.__init__`` registers ``self.cleanup`` at exit
    before it compiles; for the agent's programs that met the deferred starter thread shutting the same program
    down (KeyError on ``tracepoint_fds``, ioctl EBADF lines after the run's summary). An owned program is
    cleaned up by its receiver's shutdown only; one still compiling when the process exits is released by the
    kernel with the process's descriptors (BCC attaches through perf_event_open: nothing outlives them)."""

    def register(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        if getattr(_owning, "depth", 0):
            return fn
        return atexit.register(fn, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(atexit, name)


@contextlib.contextmanager
def owned_program() -> Iterator[None]:
    """BCC programs built by this thread meanwhile register no cleanup at exit: the caller cleans them up."""
    _owning.depth = getattr(_owning, "depth", 0) + 1
    try:
        yield
    finally:
        _owning.depth -= 1


def headers_dir() -> Path | None:
    """Where BCC will find kernel headers: $BCC_KERNEL_SOURCE (BCC's own override) or
    /lib/modules/$(uname -r)/build. None when they are not there."""
    src = os.environ.get("BCC_KERNEL_SOURCE")
    d = Path(src) if src else Path(f"/lib/modules/{platform.release()}/build")
    return d if (d / "include").is_dir() else None


def require_bpf() -> Any:
    """Checks privilege, BCC and headers; returns the bcc module or raises a clear error."""
    if os.geteuid() != 0:
        raise PrivilegeError("loading eBPF programs needs root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN)",
                             hint="run with sudo, or grant the capabilities to the agent's container")
    bcc = import_bcc()
    if headers_dir() is None:
        raise KernelHeadersError(f"no kernel headers for kernel {platform.release()}: BCC cannot compile",
                                 hint=HEADERS_HINT)
    return bcc


class _Captured:
    def __init__(self) -> None:
        self.data = b""

    def text(self) -> str:
        return self.data.decode(errors="replace")


def _stderr_handlers() -> list[logging.StreamHandler[Any]]:
    """Logging handlers that write to fd 2."""
    out: list[logging.StreamHandler[Any]] = []
    for logger in (logging.getLogger(), logging.getLogger("otel_ebpf")):
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler):
                try:
                    if h.stream.fileno() == 2:
                        out.append(h)
                except (AttributeError, OSError, ValueError):
                    continue
    return out


@contextlib.contextmanager
def capture_stderr() -> Iterator[_Captured]:
    """Capture fd 2 (clang and the verifier write there) and echo it back afterwards.

    fd 2 is process-wide: while it points at the capture file, log records of other threads
    (another receiver starting, e.g. "nvml receiver disabled") would land there too. Logging
    handlers on fd 2 write to a copy of the real stderr meanwhile."""
    captured = _Captured()
    saved = os.dup(2)
    real = os.fdopen(os.dup(saved), "w", buffering=1)
    swapped = [(h, h.setStream(real)) for h in _stderr_handlers()]
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            for h, old in swapped:
                h.setStream(old)
            real.close()
            tmp.seek(0)
            captured.data = tmp.read()[-200_000:]
            if captured.data:
                log.debug("BCC output:\n%s", captured.text())


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a load that failed with EAGAIN. BCC raises a plain Exception naming
    strerror(errno) ("Failed to load BPF program b'f': Resource temporarily unavailable")."""
    if isinstance(exc, OSError):
        return exc.errno == errno.EAGAIN
    return os.strerror(errno.EAGAIN) in str(exc)


def retry_interrupted_load(load: Callable[[], T], what: str, attempts: int = LOAD_ATTEMPTS) -> T:
    """``load()``, tried again (up to ``attempts`` in all) while it fails with EAGAIN: the
    verifier gives up with EAGAIN when a signal is pending for the loading thread (kernel
    ``bpf_check``/``do_check``: ``signal_pending(current)``), e.g. while py-spy attaches to the
    agent. Each retry is logged at debug level; nothing is counted. Any other failure, or the
    last EAGAIN, is raised as is."""
    for attempt in range(1, attempts):
        try:
            return load()
        except Exception as exc:
            if not _interrupted(exc):
                raise
            log.debug("%s: the BPF program load was interrupted by a pending signal (EAGAIN), "
                      "attempt %d of %d: retrying", what, attempt, attempts)
    return load()


def programs_loaded(ctx: Context) -> None:
    """Every BPF program of ``ctx`` is loaded (receivers compile only at start): unpin the map
    they share, so a SIGKILLed agent leaves nothing on bpffs, and give back the compiler's
    memory (~110 MiB of RSS, otel_ebpf.bpf.compiler_memory). Called by whoever started the receivers."""
    from otel_ebpf.bpf.compiler_memory import release_compiler_memory

    threadctx.unpin(ctx)
    pauseguard.unpin(ctx)
    release_compiler_memory()


_KEPT_KINDS = ("anon_inode:[perf_event]", "anon_inode:bpf_link")  # what detaching waits on: kept by the closer
_CLOSER_WAIT_S = 600.0  # the closer leaves by then even if this process has not exited
_closer_lock = threading.Lock()
_closer_pipe: int | None = None  # write end, held until this process exits: the closer waits for its EOF


def _probe_fds() -> list[int]:
    """This process's perf-event and BPF-link fds (uprobes, USDT probes, tracepoints of every program)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") in _KEPT_KINDS:
                out.append(int(name))
    return sorted(out)


def _closer(keep: list[int], wait_fd: int) -> None:
    """In the double-forked child: close every fd but ``keep`` (the probes) and ``wait_fd`` (so no pipe or
    terminal of the agent's stays open: ``otel-ebpf run -- x | tee log`` waits for every writer of its pipe),
    wait until the agent has exited (EOF on ``wait_fd``), then leave: the kernel closes the probes.
    Only readlink(), close(), select() and _exit(): safe after fork() in a threaded process."""
    try:
        for fd in keep:  # an fd closed and its number reused by another thread since it was listed
            try:
                if os.readlink(f"/proc/self/fd/{fd}") not in _KEPT_KINDS:
                    os.close(fd)
            except OSError:
                continue
        low = 0
        for fd in sorted([*keep, wait_fd]):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 20)
        with contextlib.suppress(OSError):
            select.select([wait_fd], [], [], _CLOSER_WAIT_S)
    finally:
        os._exit(0)


def hand_off_probes() -> int:
    """Let a detached child hold every probe of this process (perf-event and BPF-link fds) from now until
    this process has exited, then release them: returns how many it holds (0 when it could not fork).

    Unregistering a uprobe or a tracepoint waits for an RCU grace period, one probe after another
    (measured ~0.1-0.16 s each on 6.18): 5 receivers' 30 tracepoints held the exit of ``run -- true`` 4.8 s,
    94 CUDA + NCCL uprobes 10-15 s. While the child holds a reference, this process's own closes (BCC's
    cleanup, RefCtrUprobes.close, its exit) are not the last and cost nothing; the child's are waited for by
    no one. The probes stop firing once disabled or no process they trace is left; their programs' pause
    leases are revoked before (BpfReceiver.shutdown), so they never stop a process again. The child keeps no
    other fd of this process (not its stdout, stderr or sockets). Once per process; later calls return 0.
    For a process that exits right after (the CLI's ``run``): the probes stay until then."""
    global _closer_pipe
    with _closer_lock:
        if _closer_pipe is not None:
            return 0
        keep = _probe_fds()
        if not keep:
            return 0
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return 0  # each close then waits as before
        if pid == 0:  # child: fork again so init reaps the closer, then leave at once
            try:
                if os.fork() == 0:
                    _closer(keep, r)
            finally:
                os._exit(0)
        os.close(r)
        os.waitpid(pid, 0)
        _closer_pipe = w
        return len(keep)


def release_uprobes_in_background(bpf: Any) -> int:
    """Release ``bpf``'s uprobes and tracepoints without waiting (:func:`hand_off_probes`): returns how many it
    held. They are disabled and dropped from BCC's bookkeeping here (cheap now), so ``bpf.cleanup()`` has
    nothing slow left; the records they still make are not read (the ring buffer has been drained)."""
    uprobes = dict(getattr(bpf, "uprobe_fds", {}))
    tracepoints = dict(getattr(bpf, "tracepoint_fds", {}))
    if not uprobes and not tracepoints:
        return 0
    hand_off_probes()
    if _closer_pipe is None:
        return 0  # no closer: BCC's own cleanup detaches them, slowly
    bcc = import_bcc()
    for ev_name, fd in uprobes.items():
        with contextlib.suppress(OSError):
            os.close(fd)
        bcc.lib.bpf_detach_uprobe(ev_name if isinstance(ev_name, bytes) else ev_name.encode())
        bpf._del_uprobe_fd(ev_name)  # BCC's own bookkeeping (it counts open probes globally)
    for tp, fd in tracepoints.items():
        bcc.lib.bpf_close_perf_event_fd(fd)  # disable, then a close that is not the last
        del bpf.tracepoint_fds[tp]
    return len(uprobes) + len(tracepoints)


def all_pids() -> list[int]:
    """Every process now running (node-agent mode scans their maps for loaded libraries)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]
