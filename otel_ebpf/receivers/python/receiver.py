"""The Python receiver: the interpreter's USDT probes (python.bpf.c) -> :class:`PythonCall`.

Start: pick the interpreter build (config ``interpreter``, the traced command's interpreter,
the traced processes' executables, this agent's interpreter), read its probes
(:mod:`.usdt`), compile the program with their argument locations and the filters, then
attach to every traced process that runs that interpreter. A process that becomes one later
(``exec``, reported by common.bpf.c as lifecycle record 3) is attached when its exec record
is read; the probes stay attached through later execs of the same process. Detached at exit.

Limits: calls made between a process's exec and the attach (a few milliseconds) are missed,
and so are children that fork without exec (multiprocessing's "fork" start method), which are
not attached. Only one interpreter build per agent (its argument locations are compiled in):
processes of another build are counted (reason=interpreter_mismatch) and named in a warning.

Threading: ``decode`` and lifecycle handling run on the poll thread; attach/detach hold a lock.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import logging
import os
import struct
import sys
import threading
import time
from pathlib import Path

from otel_ebpf.bpf.maps import array_deltas
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.errors import AttachError, OtelEbpfError
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.libraries import interpreter_of_command

from .config import PREFIX_LEN, Config
from .events import PythonCall
from otel_ebpf.bpf.python_usdt import NoUsdtError, UsdtSite, arg_macros, attach_site, find_sites

__all__ = ["CALL", "NO_ENTRY_MESSAGE", "PythonReceiver", "no_entry_probe"]

log = logging.getLogger(__name__)


CALL = Mirror("py_call_rec", 112, struct.Struct("<B3xIIIQQQQi4x128s64s"),
              ("type", "pid", "tid", "depth", "start_ns", "end_ns", "parent_start", "root_start", "line",
               "file", "func"))
_COUNTS = ("stack_too_deep", "unpaired_returns", "entries")  # python.bpf.c PY_CNT_* order
# The entry probe (nearly) never fires while returns flow: once this many returns were unpaired with
# fewer than 1 entry per _ENTRY_RATIO of them, or at shutdown, say why (CPython gh-98894). Not "no entry
# at all": CPython 3.11 still fires a few (5 in a 1 s loop of 370,000 calls), so that test never warned.
# A few unpaired returns are normal: frames entered before the probes attached.
_NO_ENTRY_UNPAIRED = 1000
_ENTRY_RATIO = 100
NO_ENTRY_MESSAGE = ("python:function__return fires but python:function__entry does not: CPython 3.11 to 3.14 "
                    "fire function__entry only while a profile or trace function is set (CPython gh-98894, "
                    "fixed in 3.15), so no call can be timed")
NO_ENTRY_HINT = ("set receivers.python.profile_hook: true (run -- CMD starts the job with a do-nothing profile "
                 "function, ~0.1 us per call), or set one in the job (sys.setprofile(slice) and "
                 "threading.setprofile(slice)), use a CPython <= 3.10 or >= 3.15 built --with-dtrace, or use the "
                 "'torch' receiver for operator spans")


def no_entry_probe(unpaired: int, entries: int) -> bool:
    """The entry probe is (nearly) silent while returns flow: gh-98894, no profile function set."""
    return unpaired >= _NO_ENTRY_UNPAIRED and entries * _ENTRY_RATIO < unpaired


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _uses(pid: int, path: str) -> bool:
    """Process ``pid`` runs or maps the file ``path`` (executable, or libpython)."""
    try:
        if os.path.realpath(f"/proc/{pid}/exe") == path:
            return True
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            return any(line.rstrip().endswith(path) for line in fh)
    except OSError:
        return False


def _pythonish(pid: int) -> str | None:
    """The executable of ``pid`` when it looks like a Python interpreter, else None."""
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return None
    return exe if os.path.basename(exe).startswith("python") else None


class PythonReceiver(BpfReceiver):
    """Receiver ``python``: one :class:`PythonCall` per call that passes the filters, for the
    processes in ``ctx.target_pids`` and their children that exec the interpreter (every such
    process on the host when there are no targets, except this agent)."""

    name = "python"
    start_early = True  # USDT on the interpreter: its first calls are made before any library opens
    src_file = Path(__file__).with_name("python.bpf.c")
    thread_context = True  # writes the thread's innermost open call for the cuda program (common.bpf.c)

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages, poll_interval=config.poll_interval)
        self.config = config
        ctx.thread_ctx_writers.add(self.name)  # the cuda program reads the map only then
        self.sites: dict[str, UsdtSite] | None = None
        self._pids: dict[int, list[str]] = {}  # pid -> uprobe event names
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._counts_seen = [0] * len(_COUNTS)
        self._attached_at: float | None = None  # monotonic time of the first attach
        self._no_entry_said = False

    # ---- interpreter -------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        out = [self.config.interpreter] if self.config.interpreter else []
        cmd = interpreter_of_command(list(self.ctx.libraries.get("command", [])))
        if cmd:
            out.append(cmd)
        out += [exe for pid in self.ctx.target_pids if (exe := _pythonish(pid))]
        out.append(os.path.realpath(sys.executable))
        return list(dict.fromkeys(out))

    def find_interpreter(self) -> dict[str, UsdtSite]:
        """The probes of the first candidate interpreter that has them. An explicitly configured
        interpreter, or the command's, without probes is an error (strict) or a warning."""
        first_error: NoUsdtError | None = None
        for i, path in enumerate(self._candidates()):
            try:
                return find_sites(path)
            except NoUsdtError as exc:
                if i == 0 and self.config.interpreter:
                    raise
                if first_error is None and os.path.basename(path).startswith(("python", "libpython")):
                    first_error = exc
                    self._warn_once(exc)
                    if self.ctx.strict:
                        raise
        raise first_error or NoUsdtError(", ".join(self._candidates()) or "no interpreter")

    def _warn_once(self, exc: OtelEbpfError) -> None:
        key = str(exc)
        if key not in self._warned and len(self._warned) < 256:
            self._warned.add(key)
            log.warning("python: %s", exc)

    # ---- program -------------------------------------------------------------------------
    def cflags(self) -> list[str]:
        if self.sites is None:
            raise RuntimeError("python receiver: cflags() before the interpreter was found")
        c = self.config
        return [f"-DPY_MAX_DEPTH={c.max_depth}", f"-DPY_MAX_THREADS={c.max_threads}",
                f"-DPY_MIN_DURATION_NS={int(c.min_duration * 1e9)}", f"-DPY_NUM_PREFIXES={len(c.path_prefixes)}",
                *arg_macros(self.sites)]

    def dump(self) -> str:
        if self.sites is None:
            self.sites = self.find_interpreter()
        return super().dump()

    def start(self) -> None:
        if self.bpf is not None:
            return
        self.sites = self.find_interpreter()
        super().start()
        if self.config.path_prefixes:
            table = self._bpf["py_prefixes"]
            for i, prefix in enumerate(self.config.path_prefixes):
                value = table.Leaf()
                raw = prefix.encode()[:PREFIX_LEN]
                value.len = len(raw)
                value.s = raw  # a c_char array field takes bytes (zero-filled after them)
                table[ct.c_int(i)] = value
        pids = self.ctx.target_pids or [int(d) for d in os.listdir("/proc") if d.isdigit()]
        for pid in pids:
            self.attach_pid(pid)

    # ---- per-process attach ----------------------------------------------------------------
    def attach_pid(self, pid: int) -> bool:
        """Attach both probes to ``pid`` if it runs the interpreter; True when attached now."""
        sites = self.sites
        if sites is None or self.bpf is None or pid == os.getpid():
            return False
        path = sites["function__entry"].path
        if not _uses(pid, path):
            self._foreign(pid)
            return False
        with self._lock:
            if pid in self._pids:
                return False
            if len(self._pids) >= self.config.max_processes:
                self.ctx.telemetry.dropped(self.name, "too_many_processes")
                return False
            events: list[str] = []
            try:
                for name, fn in (("function__entry", "py_entry"), ("function__return", "py_return")):
                    events.append(attach_site(self.bpf, sites[name], fn, pid))
            except Exception as exc:
                self._detach(events)
                self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                       library=os.path.basename(path))
                err = AttachError(path, f"python:function__entry/return (pid {pid})", str(exc))
                if self.ctx.strict:
                    raise err from None
                log.warning("python: %s", err)
                return False
            self._pids[pid] = events
            if self._attached_at is None:
                self._attached_at = time.monotonic()
        self.ctx.telemetry.add("otel_ebpf.probes.attached", len(events), receiver=self.name,
                               library=os.path.basename(path))
        log.info("python: attached to pid %d (%s)", pid, path)
        return True

    def _foreign(self, pid: int) -> None:
        """A process running some other Python: name the reason it is not traced (once per binary)."""
        exe = _pythonish(pid) if self.ctx.target_pids else None
        if exe is None:
            return
        try:
            find_sites(exe)
        except NoUsdtError as exc:
            self.ctx.telemetry.dropped(self.name, "interpreter_without_usdt")
            self._warn_once(exc)
            return
        except Exception:
            return
        self.ctx.telemetry.dropped(self.name, "interpreter_mismatch")
        assert self.sites is not None
        self._warn_once(OtelEbpfError(
            f"pid {pid} runs {exe}, another interpreter build than {self.sites['function__entry'].path} "
            f"(one per agent)", hint="set receivers.python.interpreter to the one to trace"))

    def _detach(self, events: list[str]) -> None:
        for ev in events:
            try:
                self.bpf.detach_uprobe_event(ev.encode())
            except Exception:
                log.debug("python: detaching %s failed", ev, exc_info=True)

    def _lifecycle(self, etype: int, raw: bytes) -> None:
        super()._lifecycle(etype, raw)
        if etype not in (1, 3):
            return
        pid = struct.unpack_from("<I", raw, 4)[0]
        if etype == 3:
            self.attach_pid(pid)
            return
        with self._lock:
            events = self._pids.pop(pid, [])
        self._detach(events)

    @property
    def attached_pids(self) -> list[int]:
        with self._lock:
            return list(self._pids)

    # ---- records ---------------------------------------------------------------------------
    def decode(self, etype: int, raw: bytes) -> object | None:
        if etype != CALL.etype:
            raise ValueError(f"unknown Python record type {etype}")
        (_, pid, tid, depth, start, end, parent, root, line, file_b, func_b) = CALL.fmt.unpack_from(raw)
        to_epoch = self.clock.to_epoch_ns
        return PythonCall(pid, tid, _cstr(func_b), _cstr(file_b), line, depth, to_epoch(start), to_epoch(end),
                          to_epoch(parent) if parent else 0, to_epoch(root) if root else 0)

    def poll_maps(self) -> list[object]:
        if self.bpf is None:
            return []
        try:
            self._read_counts(final=False)
        except Exception:
            self.ctx.telemetry.dropped(self.name, "map_read_error")
        return []

    def _read_counts(self, *, final: bool) -> None:
        for reason, delta in array_deltas(self.bpf["py_counts"], _COUNTS, self._counts_seen):
            if reason == "entries":
                continue
            if reason == "stack_too_deep":
                self.ctx.telemetry.dropped(self.name, reason, delta)
            else:
                self.ctx.telemetry.add("otel_ebpf.python.unpaired_returns", delta, receiver=self.name)
        _, unpaired, entries = self._counts_seen
        if not self._no_entry_said and no_entry_probe(unpaired, entries):
            self._no_entry_said = True
            log.warning("python: %s", OtelEbpfError(f"{NO_ENTRY_MESSAGE} ({unpaired} returns, {entries} entries "
                                                    "so far)", hint=NO_ENTRY_HINT))

    def shutdown(self) -> None:
        if self.bpf is not None:
            with contextlib.suppress(Exception):
                self._read_counts(final=True)
        super().shutdown()  # BCC cleanup detaches every uprobe
        with self._lock:
            self._pids.clear()
