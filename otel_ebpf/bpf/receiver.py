"""Loading BCC programs: environment checks, compilation, attachment, ring-buffer polling.

:class:`BpfReceiver` is the base of every BPF receiver. A subclass names its ``.bpf.c`` file,
its library key and probes, and turns raw records into typed events; the base does the rest:
compile with ``-D`` parameters, seed the traced PIDs, attach uprobes to every known copy of the
library (and to copies opened later), poll the ring buffer on its own thread, export the
in-kernel drop counters, and clean up (detach, resume paused processes) on shutdown.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import logging
import os
import platform
import signal
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf import pauseguard
from otel_ebpf.bpf import threadctx
from otel_ebpf.bpf import clock as kernel_clock
from otel_ebpf.core.errors import AttachError, BccMissingError, BpfLoadError, KernelHeadersError, PrivilegeError
from otel_ebpf.core.events import LibraryLoaded, ProcessExit
from otel_ebpf.core.pipeline import Consumer, Context

__all__ = ["INCLUDE_DIR", "BpfReceiver", "Probe", "headers_dir", "import_bcc", "programs_loaded",
           "release_uprobes_in_background", "require_bpf"]

log = logging.getLogger(__name__)
INCLUDE_DIR = Path(__file__).parent / "include"
COMMON_SRC = INCLUDE_DIR / "common.bpf.c"
_CHUNK = 4096  # records handed to the pipeline at a time
_FIRST_RECEIVER_TYPE = 16  # record types below are common.bpf.c's (1 exit, 2 library open, 3 exec)
_BACKPRESSURE_S = 1.0  # longest a receiver waits for the pipeline before dropping a chunk
DROP_REASONS = ("ringbuf_full", "pid_map_full", "state_map_full", "stats_map_full", "lifecycle_ringbuf_full",
                "context_map_full", "paused_map_full")
_EXIT = struct.Struct("<B3xIQ16s")
_LIBOPEN = struct.Struct("<BB2xII4xQ256s")
PAUSES_TIMED_OUT = "otel_ebpf.pauses.timed_out"
PAUSES_SKIPPED = "otel_ebpf.pauses.skipped"
_SKIP_REASONS = ("agent_late", "guard_late")  # oe_pause_skips[] indexes in common.bpf.c
_MAX_UNCONFIRMED = 4096
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
    return bcc


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


def _stderr_handlers() -> list[logging.StreamHandler]:
    """Logging handlers that write to fd 2."""
    out = []
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
def _capture_stderr() -> Iterator[_Captured]:
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
                h.setStream(old)  # type: ignore[arg-type]
            real.close()
            tmp.seek(0)
            captured.data = tmp.read()[-200_000:]
            if captured.data:
                log.debug("BCC output:\n%s", captured.text())


@dataclass(frozen=True)
class Probe:
    """A uprobe on ``symbol`` calling BPF function ``entry`` and/or uretprobe ``ret``.
    ``optional`` symbols (absent in some library versions) fail silently when missing."""

    symbol: str
    entry: str | None = None
    ret: str | None = None
    optional: bool = False


class BpfReceiver:
    """Base of BPF receivers. Subclasses set ``name``, ``src_file``, ``library_key``, ``probes``
    and implement :meth:`decode` (raw bytes -> event or None) and optionally :meth:`poll_maps`.

    Thread safety: decode runs on the poll thread only. ``shutdown`` is idempotent.
    """

    name = "bpf"
    src_file: Path
    library_key: str | None = None
    lib_pattern: str | None = None
    probes: Sequence[Probe] = ()
    thread_context = False  # uses oe_thread_ctx (common.bpf.c, otel_ebpf.bpf.threadctx): cuda, python, torch

    def __init__(self, ctx: Context, next_: Consumer, *, ringbuf_pages: int = 256,
                 pause_on_load: bool = False, extra_libraries: Sequence[str] = (),
                 poll_interval: float = 0.1) -> None:
        self.ctx, self.next = ctx, next_
        self.clock = kernel_clock.shared(ctx)  # the agent's one clock: every receiver converts alike
        self._ctx_pin: str | None = None  # oe_thread_ctx's bpffs pin while loaded (thread_context)
        self._ringbuf_pages = ringbuf_pages
        self._pause = pause_on_load
        self._extra_libs = list(extra_libraries)
        self._poll_ms = max(1, int(poll_interval * 1000))
        self._bpf: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._batch: list[object] = []
        self._attached: set[str] = set()
        self._paused: set[int] = set()
        self._unconfirmed: dict[tuple[int, int], int] = {}  # (pid, stop ts) resumed -> rounds seen stopped
        self._paused_pin: str | None = None  # oe_paused's bpffs pin while loaded (otel_ebpf.bpf.paused)
        self._guard: pauseguard.PauseGuard | None = None  # while loaded with pause_on_load
        self._guard_slot = 0
        self._skips_seen = [0] * len(_SKIP_REASONS)
        self._drops_seen = [0] * len(DROP_REASONS)
        self._attach_lock = threading.Lock()
        self._seen_pids: OrderedDict[int, None] = OrderedDict()
        self._exits: list[object] = []  # held until the call records before them are read

    # ---- to override -----------------------------------------------------------------
    def cflags(self) -> list[str]:
        return []

    def decode(self, etype: int, raw: bytes) -> object | None:
        return None

    def poll_maps(self) -> list[object]:
        """Called every poll round-trip at most once per ``maps_interval``: read in-kernel maps."""
        return []

    # ---- program ---------------------------------------------------------------------
    def program_cflags(self) -> list[str]:
        flags = [f"-I{Path(self.src_file).parent}",
                 f"-DOE_FILTER_PIDS={1 if self.ctx.target_pids else 0}",
                 f"-DOE_RINGBUF_PAGES={self._ringbuf_pages}",
                 f"-DOE_PAUSE_ON_LOAD={1 if self._pause else 0}", "-Wno-unused-function"]
        if self.lib_pattern:
            flags.append(f'-DOE_LIB_PATTERN="{self.lib_pattern}"')
        if self.thread_context:
            flags.append("-DOE_THREAD_CTX=1")
            if self._ctx_pin:
                flags.append(f'-DOE_THREAD_CTX_PIN="{self._ctx_pin}"')
        if self._paused_pin:
            flags.append(f'-DOE_PAUSED_PIN="{self._paused_pin}"')
        if self._guard is not None and self._guard.pin:
            flags += [f'-DOE_PAUSE_GUARD_PIN="{self._guard.pin}"', f"-DOE_GUARD_SLOT={self._guard_slot}"]
        return [*flags, f"-DOE_AGENT_TGID={os.getpid()}", *self.cflags()]

    def source(self) -> str:
        """The shared part (common.bpf.c) followed by the receiver's own program."""
        return (f"// ---- {COMMON_SRC.name}\n{COMMON_SRC.read_text()}\n"
                f"// ---- {Path(self.src_file).name}\n#line 1 \"{self.src_file}\"\n"
                f"{Path(self.src_file).read_text()}")

    def dump(self) -> str:
        """The program as compiled: the -D parameters, then the source."""
        return "// cflags: " + " ".join(self.program_cflags()) + "\n" + self.source()

    def _load(self) -> Any:
        bcc = require_bpf()
        if self.thread_context and self._ctx_pin is None:
            self._ctx_pin = threadctx.acquire(self.ctx)
        # stops a SIGKILLed agent left behind are resumed before this program can make new ones
        paused_map.recover_stale(self.ctx.telemetry)
        if self._pause and self.lib_pattern and self._paused_pin is None:
            self._paused_pin = paused_map.new_pin(self.name)
        if self._pause and self.lib_pattern and self._guard is None:
            self._guard = pauseguard.acquire(self.ctx, self.ctx.pause_timeout)
            self._guard_slot = self._guard.new_slot()
        try:
            with _capture_stderr() as errors:
                return bcc.BPF(text=self.source(), cflags=self.program_cflags())
        except Exception as exc:
            threadctx.release(self._ctx_pin)
            self._ctx_pin = None
            paused_map.unpin(self._paused_pin)
            self._paused_pin = None
            self._release_guard()
            detail = "\n".join(line for line in errors.text().splitlines() if "error" in line)[-3000:]
            raise BpfLoadError(f"{self.name}: BPF program {self.src_file} failed to load: {exc}\n{detail}",
                               hint="run with --dump-bpf to see the program; see docs/troubleshooting.md"
                               ) from None

    # ---- attach ----------------------------------------------------------------------
    def attach_library(self, path: str) -> int:
        """Attach every probe to ``path``; returns how many attached. Safe to call twice."""
        real = os.path.realpath(path)
        with self._attach_lock:
            if real in self._attached or self._bpf is None:
                return 0
            self._attached.add(real)
            n = 0
            for p in self.probes:
                n += self._attach_one(real, p)
        tel = self.ctx.telemetry
        tel.add("otel_ebpf.probes.attached", n, receiver=self.name, library=os.path.basename(real))
        log.info("%s: attached %d probes to %s", self.name, n, real)
        return n

    def _attach_one(self, path: str, p: Probe) -> int:
        n = 0
        for fn, attach in ((p.entry, self._bpf.attach_uprobe), (p.ret, self._bpf.attach_uretprobe)):
            if fn is None:
                continue
            try:
                attach(name=path, sym=p.symbol, fn_name=fn)
                n += 1
            except Exception as exc:
                if p.optional:
                    continue
                self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                       library=os.path.basename(path))
                err = AttachError(path, p.symbol, str(exc).strip() or type(exc).__name__)
                if self.ctx.strict:
                    raise err from None
                log.warning("%s: %s", self.name, err)
        return n

    def initial_libraries(self) -> list[str]:
        from otel_ebpf.host.libraries import find_libraries

        if self.library_key is None:
            return []
        # ldconfig's system-wide copies matter only when tracing every process; a traced command
        # that loads one is caught at openat anyway, and each needless attach costs ~0.1 s to undo.
        return find_libraries(self.library_key, configured=self._extra_libs,
                              pids=self.ctx.target_pids or _all_pids(),
                              command=self.ctx.libraries.get("command", []),
                              use_ldconfig=not self.ctx.target_pids)

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._bpf is not None:
            return
        self._bpf = self._load()
        if self.ctx.target_pids:
            traced = self._bpf["traced"]
            for pid in self.ctx.target_pids:
                traced[ct.c_uint32(pid)] = ct.c_uint8(1)
        for lib in self.initial_libraries():
            self.attach_library(lib)
        self._bpf["events"].open_ring_buffer(self._on_record)
        self._bpf["lifecycle"].open_ring_buffer(self._on_record)
        if self._guard is not None:  # the poll loop starts now: a library opened from here on is paused
            self._guard.renew(self._guard_slot)
        self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-{self.name}", daemon=True)
        self._thread.start()

    def _on_record(self, _ctx: Any, data: Any, size: int) -> int:
        try:
            raw = ct.string_at(data, size)
            etype = raw[0]
            if etype < _FIRST_RECEIVER_TYPE:
                self._lifecycle(etype, raw)
                return 0
            ev = self.decode(etype, raw)  # the hot path: one receiver record
            if ev is not None:
                pid = getattr(ev, "pid", None)
                if pid is not None and pid not in self._seen_pids:
                    self._snapshot(pid)
                self._batch.append(ev)
                if len(self._batch) >= _CHUNK:
                    self._flush(with_maps=False)
        except Exception:  # hot path: count, never raise into BCC
            self.ctx.telemetry.dropped(self.name, "decode_error")
        return 0

    def _lifecycle(self, etype: int, raw: bytes) -> None:
        """exec (3): read the process's identity now; library open (2): attach, resume;
        exit (1): held until the call records submitted before it are read (see _run): it
        comes on the lifecycle ring buffer, which epoll may report before the events ring
        that still holds the process's last calls."""
        if etype == 2:
            self._batch.append(self._library_opened(raw))
            return
        _, pid, ts, comm = _EXIT.unpack_from(raw)
        if etype == 3:
            self._snapshot(pid, refresh=True)
        elif etype == 1:
            self._exits.append(ProcessExit(pid, self.clock.to_epoch_ns(ts),
                                           comm.split(b"\0", 1)[0].decode(errors="replace"), -1,
                                           source=self.name))

    def _snapshot(self, pid: int, *, refresh: bool = False) -> None:
        """Read the process's /proc identity now, while it is alive (bounded memory of pids)."""
        self._seen_pids[pid] = None
        if len(self._seen_pids) > 65536:
            self._seen_pids.popitem(last=False)
        cache = self.ctx.resources
        if cache is not None:
            if refresh:
                cache.evict(pid)  # exec keeps pid and start time, but not the program
            cache.get(pid)

    def _library_opened(self, raw: bytes) -> LibraryLoaded:
        _, paused, pid, tid, ts, path_b = _LIBOPEN.unpack_from(raw)
        path = path_b.split(b"\0", 1)[0].decode(errors="replace")
        if paused:
            self._paused.add(pid)
        self._snapshot(pid)
        try:
            full = path if path.startswith("/") else os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
            root = f"/proc/{pid}/root{full}"
            self.attach_library(root if os.path.exists(root) else full)
        except OSError as exc:
            log.warning("%s: pid %d opened %s but it cannot be attached: %s", self.name, pid, path, exc)
        finally:
            if paused:
                self._resume(pid, ts)
        return LibraryLoaded(pid, tid, self.clock.to_epoch_ns(ts), path)

    def _resume(self, pid: int, ts: int | None = None) -> None:
        """SIGCONT ``pid`` stopped at ``ts`` (None: every stop of it, at shutdown). Its record in
        oe_paused (otel_ebpf.bpf.paused) is forgotten only once the process is seen running
        (:meth:`_confirm_resumed`, next poll round): the kernel may deliver the program's SIGSTOP
        after this SIGCONT (bpf_send_signal defers it to irq_work when preemption is off), and
        while the record stays the pause guard resumes a late stop after pause_timeout. A stop no
        longer recorded was resumed by the pause guard (pause_timeout ran out first): counted in
        otel_ebpf.pauses.timed_out, logged, and not continued again (its user may have stopped
        it since)."""
        self._paused.discard(pid)
        if ts is not None and not paused_map.recorded(self._bpf, pid, ts):
            held_s = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - ts) / 1e9
            self.ctx.telemetry.add(PAUSES_TIMED_OUT, 1, receiver=self.name)
            log.warning("%s: pid %d was resumed by the pause guard after pause_timeout (%.1fs), before its "
                        "probes were attached (%.1fs after its stop): its first calls were not traced",
                        self.name, pid, self.ctx.pause_timeout, held_s)
            return
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            paused_map.forget(self._bpf, pid, ts)
            return
        if ts is None:
            paused_map.forget(self._bpf, pid, None)
        elif len(self._unconfirmed) < _MAX_UNCONFIRMED:
            self._unconfirmed[(pid, ts)] = 0
        else:  # bounded: forget at once (a late SIGSTOP of this stop is then not covered)
            paused_map.forget(self._bpf, pid, ts)

    def _confirm_resumed(self) -> None:
        """Forget the stops resumed in earlier rounds whose process runs (or is gone); send
        SIGCONT again to one still stopped (its SIGSTOP landed after ours), up to 3 rounds,
        then leave its record to the pause guard."""
        for (pid, ts), rounds in list(self._unconfirmed.items()):
            st = paused_map.process_stat(pid)
            if st is not None and st[0] == "T" and rounds < 3:
                self._unconfirmed[(pid, ts)] = rounds + 1
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
                continue
            del self._unconfirmed[(pid, ts)]
            if st is None or st[0] != "T":
                paused_map.forget(self._bpf, pid, ts)

    def _flush(self, with_maps: bool = True) -> None:
        extra = self.poll_maps() if with_maps else None
        batch, self._batch = self._batch, []
        if extra:
            batch.extend(extra)
        if batch:
            self.ctx.telemetry.add("otel_ebpf.events.received", len(batch), receiver=self.name)
            if getattr(self.next, "backpressure", False):
                self.next.consume(batch, block_s=_BACKPRESSURE_S)  # type: ignore[call-arg]
            else:  # a consumer without backpressure (tests, the Python API)
                self.next.consume(batch)

    def _read_drops(self) -> None:
        for reason, n in self._array_deltas("drops", DROP_REASONS, self._drops_seen):
            self.ctx.telemetry.dropped(self.name, reason, n)
        if self._guard is not None:
            for reason, n in self._array_deltas("oe_pause_skips", _SKIP_REASONS, self._skips_seen):
                self.ctx.telemetry.add(PAUSES_SKIPPED, n, receiver=self.name, reason=reason)

    def _array_deltas(self, table: str, names: Sequence[str], seen: list[int]) -> list[tuple[str, int]]:
        """(name, growth since the last read) of each counter of BPF array ``table`` that grew."""
        counters, out = self._bpf[table], []
        for i, name in enumerate(names):
            total = counters[ct.c_int(i)].value
            if total > seen[i]:
                out.append((name, total - seen[i]))
                seen[i] = total
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._guard is not None:  # this loop resumes: while it turns, stops may be made
                    self._guard.renew(self._guard_slot)
                self._bpf.ring_buffer_poll(self._poll_ms)
                if self._unconfirmed:
                    self._confirm_resumed()
                exits, self._exits = self._exits, []
                self._bpf.ring_buffer_consume()  # records submitted without a wakeup
                self._batch.extend(exits)  # after every call record submitted before them
                self._read_drops()
                self._flush()
            except Exception:
                log.exception("%s: poll loop error", self.name)
        self._drain()

    def _drain(self) -> None:
        try:
            self._bpf.ring_buffer_consume()
            exits, self._exits = self._exits, []
            self._bpf.ring_buffer_consume()
            self._batch.extend(exits)
            self._read_drops()
            self._flush()
        except Exception:
            log.exception("%s: final drain failed", self.name)

    # Set by the agent when this process exits right after shutdown (the CLI): uprobes are then
    # released by a detached child instead of here (see release_uprobes_in_background).
    detach_in_background = False

    def shutdown(self) -> None:
        if self._guard is not None:
            self._guard.revoke(self._guard_slot)  # no new stops from here on
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        held = paused_map.hold(self._bpf) if self._bpf is not None else None
        for pid in list(self._paused):
            self._resume(pid)
        if self._bpf is not None and self.detach_in_background:
            release_uprobes_in_background(self._bpf)
        if self._bpf is not None:
            try:
                self._bpf.cleanup()
            except Exception:
                log.debug("%s: cleanup failed", self.name, exc_info=True)
            self._bpf = None
        paused_map.release(held, self._paused_pin, self.name)  # programs detached: no new stops
        self._paused_pin = None
        self._release_guard()
        threadctx.release(self._ctx_pin)
        self._ctx_pin = None

    def _release_guard(self) -> None:
        if self._guard is not None:
            self._guard = None
            pauseguard.release(self.ctx)

    def add_target(self, pid: int) -> None:
        """Trace one more process tree (used by ``run -- CMD`` after fork, before exec)."""
        if self._bpf is not None:
            self._bpf["traced"][ct.c_uint32(pid)] = ct.c_uint8(1)

    @property
    def bpf(self) -> Any:
        return self._bpf



def programs_loaded(ctx: Context) -> None:
    """Every BPF program of ``ctx`` is loaded (receivers compile only at start): unpin the map
    they share, so a SIGKILLed agent leaves nothing on bpffs, and give back the compiler's
    memory (~110 MiB of RSS, otel_ebpf.bpf.compiler_memory). Called by whoever started the receivers."""
    from otel_ebpf.bpf.compiler_memory import release_compiler_memory

    threadctx.unpin(ctx)
    pauseguard.unpin(ctx)
    release_compiler_memory()


def release_uprobes_in_background(bpf: Any) -> int:
    """Release ``bpf``'s uprobes without waiting: returns how many were handed off.

    Closing a uprobe's perf-event fd unregisters it, and the kernel waits for an RCU grace
    period per uprobe (measured ~0.1 s each on 6.18, one after another): 94 CUDA + NCCL probes
    held the agent's exit for 10-15 s after the traced command had ended. A double-forked
    child inherits the fds, closes them and exits; this process drops its references at once
    (cheap, they are not the last ones). The probes stop firing within those seconds; their
    records are no longer read (the ring buffer has been drained and no traced process is left).
    The child only calls close() and _exit(), which is safe after fork() in a threaded process.
    """
    fds = dict(getattr(bpf, "uprobe_fds", {}))
    if not fds:
        return 0
    try:
        pid = os.fork()
    except OSError:
        return 0  # BCC's own cleanup detaches them, slowly
    if pid == 0:  # child: fork again so init reaps the closer, then leave at once
        try:
            if os.fork() == 0:
                for fd in fds.values():
                    with contextlib.suppress(OSError):
                        os.close(fd)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    bcc = import_bcc()
    for ev_name, fd in fds.items():
        with contextlib.suppress(OSError):
            os.close(fd)
        bcc.lib.bpf_detach_uprobe(ev_name if isinstance(ev_name, bytes) else ev_name.encode())
        bpf._del_uprobe_fd(ev_name)  # BCC's own bookkeeping (it counts open probes globally)
    return len(fds)


def _all_pids() -> list[int]:
    """Every process now running (node-agent mode scans their maps for loaded libraries)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]
