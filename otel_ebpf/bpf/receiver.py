"""The base of every BPF receiver: compile, attach, poll the ring buffers, clean up.

:class:`BpfReceiver` is the base of every BPF receiver. A subclass names its ``.bpf.c`` file,
its library key and probes, and turns raw records into typed events; the base does the rest:
compile with ``-D`` parameters (otel_ebpf.bpf.loader), seed the traced PIDs, attach uprobes to
every known copy of the library (and to copies opened later), poll the ring buffer on its own
thread, export the in-kernel drop counters, and clean up (detach, resume paused processes:
otel_ebpf.bpf.pausing) on shutdown.
"""
from __future__ import annotations

import ctypes as ct
import functools
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_ebpf.bpf import clock as kernel_clock
from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf import records
from otel_ebpf.bpf import threadctx
from otel_ebpf.bpf.attach import claim_library
from otel_ebpf.bpf.links import UprobeLinks
from otel_ebpf.bpf.loader import (
    COMMON_SRC,
    all_pids,
    capture_stderr,
    owned_program,
    release_uprobes_in_background,
    require_bpf,
    retry_interrupted_load,
)
from otel_ebpf.bpf.maps import array_deltas
from otel_ebpf.bpf.pausing import PAUSES_SKIPPED, SKIP_REASONS, PauseOnLoad
from otel_ebpf.bpf.ringread import Rings
from otel_ebpf.bpf.skips import ProgramSkips
from otel_ebpf.core.errors import AttachError, BpfLoadError
from otel_ebpf.core.events import LibraryLoaded, ProcessExit
from otel_ebpf.core.pipeline import Consumer, Context

__all__ = ["DROP_REASONS", "RUNS_SKIPPED", "BpfReceiver", "Probe"]

log = logging.getLogger(__name__)


def _listed(items: list[str], shown: int = 8) -> str:
    """The first ``shown`` items, and how many more."""
    return ", ".join(dict.fromkeys(items[:shown])) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _prog_name(name: bytes | str) -> str:
    """A BCC function name as text (BCC keys ``funcs`` by bytes)."""
    return name.decode(errors="replace") if isinstance(name, bytes) else name


def _short_reason(exc: Exception) -> str:
    """Why one probe did not attach, in a few words (BCC's message names the symbol and path again)."""
    text = str(exc).strip() or type(exc).__name__
    if "could not determine address of symbol" in text:
        return "not in the library"
    return text if len(text) <= 80 else text[:77] + "..."
_CHUNK = 4096  # records handed to the pipeline at a time
_DROPS_EVERY_S = 0.1  # the poll loop reads the in-kernel drop counters at most this often
_SKIPS_EVERY_S = 5.0  # ... and the kernel's count of each program's skipped runs (one fdinfo read a program)
RUNS_SKIPPED = "otel_ebpf.bpf.runs_skipped"  # {receiver, program}: runs of a program the kernel did not make
# a turn of the poll loop that found records lasts at least this long: at 20k records/s a turn
# used to hand on ~64 (one wakeup), paying its fixed costs (the pipeline's hand-off, the emitter's
# lock, the sending queue's) per few records; 5 ms holds ~100 records at 20k/s, far below a ring
# buffer's room (ringbuf_pages), and adds at most 5 ms before a record is read
_MIN_TURN_S = 0.005
_FIRST_RECEIVER_TYPE = 16  # record types below are common.bpf.c's (1 exit, 2 library open, 3 exec)
_BACKPRESSURE_S = 1.0  # longest a receiver waits for the pipeline before dropping a chunk
DROP_REASONS = ("ringbuf_full", "pid_map_full", "state_map_full", "stats_map_full", "lifecycle_ringbuf_full",
                "context_map_full", "paused_map_full")
_EXIT = struct.Struct("<B3xIQ16s")
_LIBOPEN = struct.Struct("<BB2xII4xQ256s")


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
    library_keys: tuple[str, ...] = ()  # several libraries (otel_ebpf.host.libraries keys); default (library_key,)
    lib_pattern: str | None = None
    probes: Sequence[Probe] = ()
    thread_context = False  # uses oe_thread_ctx (common.bpf.c, otel_ebpf.bpf.threadctx): cuda, python, torch
    # Its hot record types decoded in C (otel_ebpf.bpf.records.RecordDecoders): the same events as decode() makes,
    # which still decodes every other record (and any the C decoders hand back). None: decode() decodes all.
    record_decoders: records.RecordDecoders | None = None
    start_early = False  # loaded before `run -- CMD` starts the command even with a deferred start (service.deferred)

    def __init__(self, ctx: Context, next_: Consumer, *, ringbuf_pages: int = 256,
                 pause_on_load: bool = False, extra_libraries: Sequence[str] = (),
                 poll_interval: float = 0.1) -> None:
        self.ctx, self.next = ctx, next_
        self.clock = kernel_clock.shared(ctx)  # the agent's one clock: every receiver converts alike
        self._ctx_pin: str | None = None  # oe_thread_ctx's bpffs pin while loaded (thread_context)
        self._ringbuf_pages = ringbuf_pages
        self._pause = pause_on_load
        self._pauses = PauseOnLoad(self.name, ctx, pause_on_load and bool(self.lib_pattern))
        self._extra_libs = list(extra_libraries)
        self._poll_ms = max(1, int(poll_interval * 1000))
        self._bpf: Any = None
        self._thread: threading.Thread | None = None
        self._rings: Rings | None = None  # the ring buffers, read on the poll thread (otel_ebpf.bpf.ringread)
        self._links: UprobeLinks | None = None  # its uprobes, attached as BPF links where the kernel can (bpf/links)
        self._stop = threading.Event()
        self._batch: list[object] = []
        self._attached: set[str] = set()
        self._drops_seen = [0] * len(DROP_REASONS)
        self._drops_due = 0.0  # monotonic time of the next read of the drop counters
        self._skips = ProgramSkips()
        self._skips_due = 0.0  # ... and of the kernel's skip counters
        self._skips_said: set[str] = set()
        self._attach_lock = threading.Lock()
        self._seen_pids: OrderedDict[int, None] = OrderedDict()
        self._exits: list[object] = []  # held until the call records before them are read

    @property
    def pauses_on_load(self) -> bool:
        """It stops a process that opens its library until it is attached (pause_on_load and a pattern)."""
        return self._pauses.enabled

    # ---- to override -----------------------------------------------------------------
    def cflags(self) -> list[str]:
        return []

    def decode(self, etype: int, raw: bytes) -> object | None:
        return None

    def poll_maps(self) -> list[object]:
        """Called every poll round-trip at most once per ``maps_interval``: read in-kernel maps."""
        return []

    def process_seen(self, pid: int, refresh: bool) -> None:
        """Hook: ``pid`` is alive now (its first record, a library it opened while held, or, ``refresh``, an exec):
        read what must be read while it lives. Poll thread; must not raise. Default: nothing."""

    def process_exited(self, pid: int) -> None:
        """Hook: the lifecycle ring reported ``pid``'s exit (poll thread; its last records may still be unread,
        and map reads follow in the same round). Default: nothing."""

    def probes_for(self, path: str) -> Sequence[Probe]:
        """The probes for the library at ``path`` (a receiver probing several libraries chooses by name);
        none: it is not attached."""
        return self.probes

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
        return [*flags, *self._pauses.cflags(), f"-DOE_AGENT_TGID={os.getpid()}", *self.cflags()]

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
        self._pauses.prepare()
        try:
            with capture_stderr() as errors, owned_program():  # cleaned up by shutdown(), not at exit
                return retry_interrupted_load(lambda: bcc.BPF(text=self.source(), cflags=self.program_cflags()),
                                              self.name)
        except Exception as exc:
            threadctx.release(self._ctx_pin)
            self._ctx_pin = None
            self._pauses.unpin()
            detail = "\n".join(line for line in errors.text().splitlines() if "error" in line)[-3000:]
            raise BpfLoadError(f"{self.name}: BPF program {self.src_file} failed to load: {exc}\n{detail}",
                               hint="run with --dump-bpf to see the program; see docs/troubleshooting.md"
                               ) from None

    # ---- attach ----------------------------------------------------------------------
    def attach_library(self, path: str) -> int:
        """Attach every probe to ``path``; returns how many attached. Safe to call twice. One log line per
        library, "attached N of M probes to X": INFO, naming the optional symbols the library lacks, when every
        probe the receiver needs attached; else a WARNING naming the needed ones that did not (each counted in
        ``otel_ebpf.probes.failed``)."""
        probes = self.probes_for(path)
        if not probes:
            return 0
        with self._attach_lock:
            real = claim_library(self._attached, path, self._bpf is not None)
            if real is None:
                return 0
            n, wanted = 0, 0
            failed: list[str] = []
            absent: list[str] = []
            for p in probes:
                wanted += (p.entry is not None) + (p.ret is not None)
                attached, error = self._attach_one(real, p)
                n += attached
                if error is not None:
                    (absent if p.optional else failed).append(error)
        tel = self.ctx.telemetry
        tel.add("otel_ebpf.probes.attached", n, receiver=self.name, library=os.path.basename(real))
        line = f"{self.name}: attached {n} of {wanted} probes to {real}"
        if not failed:
            log.info("%s%s", line, f"; optional, absent: {_listed(absent)}" if absent else "")
        else:
            log.warning("%s; %d needed could not attach: %s", line, len(failed), _listed(failed))
        return n

    def _attach_one(self, path: str, p: Probe) -> tuple[int, str | None]:
        """(probes attached, "symbol (reason)" when one of its probes failed). A needed probe's failure is
        counted, and raises with ``strict``."""
        n, error = 0, None
        for fn, ret in ((p.entry, False), (p.ret, True)):
            if fn is None:
                continue
            try:  # attaching loads the function: a pending signal may interrupt it (loader)
                retry_interrupted_load(functools.partial(self._attach_uprobe, path, p.symbol, fn, ret), self.name)
                n += 1
            except Exception as exc:
                error = f"{p.symbol} ({_short_reason(exc)})"
                if p.optional:
                    continue
                self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                       library=os.path.basename(path))
                if self.ctx.strict:
                    raise AttachError(path, p.symbol, str(exc).strip() or type(exc).__name__) from None
        return n, error

    def _attach_uprobe(self, path: str, symbol: str, fn: str, ret: bool) -> None:
        """One uprobe (``ret``: uretprobe): a BPF link where the kernel has them (fast to detach), else BCC's."""
        if self._links is None:
            self._links = UprobeLinks(self._bpf)
        if not self._links.attach(path, symbol, fn, ret):
            (self._bpf.attach_uretprobe if ret else self._bpf.attach_uprobe)(name=path, sym=symbol, fn_name=fn)

    def detach_uprobe(self, path: str, symbol: str, ret: bool) -> None:
        """Detach one uprobe :meth:`_attach_uprobe` attached (a link, or BCC's); nothing once shut down. Raises
        (BCC's error) when it is not attached."""
        if self._bpf is None:
            return
        if self._links is not None and self._links.detach(path, symbol, ret):
            return
        (self._bpf.detach_uretprobe if ret else self._bpf.detach_uprobe)(name=path, sym=symbol)

    def open_uprobes(self) -> int:
        """Uprobes attached now: its links and BCC's perf-event ones."""
        bcc_count = self._bpf.num_open_uprobes() if self._bpf is not None else 0
        return (len(self._links) if self._links is not None else 0) + bcc_count

    def initial_libraries(self, pids: Sequence[int] = ()) -> list[str]:
        """The libraries to attach to at start: those ``pids`` (default: the targets, or every process)
        have mapped, the configured ones, the command's environment's."""
        from otel_ebpf.host.libraries import find_libraries

        keys = self.library_keys or ((self.library_key,) if self.library_key else ())
        if not keys:
            return []
        # ldconfig's system-wide copies matter only when tracing every process; a traced command
        # that loads one is caught at openat anyway, and each needless attach costs ~0.1 s to undo.
        pids = pids or self.ctx.target_pids or all_pids()
        found: list[str] = []
        for i, key in enumerate(keys):
            for path in find_libraries(key, configured=self._extra_libs if i == 0 else (), pids=pids,
                                       command=self.ctx.libraries.get("command", []),
                                       use_ldconfig=not self.ctx.target_pids):
                if path not in found:
                    found.append(path)
        return found

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._bpf is not None:
            return
        self._bpf = self._load()
        self._links = UprobeLinks(self._bpf)
        if self.ctx.target_pids:
            traced = self._bpf["traced"]
            for pid in self.ctx.target_pids:
                traced[ct.c_uint32(pid)] = ct.c_uint8(1)
        for lib in self.initial_libraries():
            self.attach_library(lib)
        decoders = self.record_decoders
        on_records = self._on_records if decoders is not None and decoders.native and records.use_native else None
        self._rings = Rings(self._bpf, ("events", "lifecycle"), self._on_raw, self.ctx.telemetry, self.name,
                            on_records=on_records)
        self._pauses.renew()  # the poll loop starts now: a library opened from here on is paused
        self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-{self.name}", daemon=True)
        self._thread.start()

    def _on_raw(self, raw: bytes) -> None:
        """One ring buffer record (otel_ebpf.bpf.ringread): decoded into the batch, or counted; never raises."""
        try:
            etype = raw[0]
            if etype < _FIRST_RECEIVER_TYPE:
                self._lifecycle(etype, raw)
                return
            ev = self.decode(etype, raw)  # the hot path: one receiver record
            if ev is not None:
                self._take(ev)
        except Exception:  # hot path: count, never raise into the reader
            self.ctx.telemetry.dropped(self.name, "decode_error")

    def _on_records(self, records: list[bytes]) -> None:
        """A poll's records (otel_ebpf.bpf.ringread), :data:`_CHUNK` at a time through the C decoders: a chunk
        they decoded whole is handed on as it is (its new pids read first, as :meth:`_on_raw` reads each); a
        chunk with records they handed back goes record by record in order, those through :meth:`_on_raw`.
        Never raises."""
        decoders = self.record_decoders
        assert decoders is not None
        for start in range(0, len(records), _CHUNK):
            chunk = records[start:start + _CHUNK] if len(records) > _CHUNK else records
            try:
                items, back, pids = decoders.decode(chunk, self.clock.offset_ns, self._seen_pids)
            except Exception:  # hot path: never raise into the reader; each record is decoded in Python instead
                log.debug("%s: C decode failed", self.name, exc_info=True)
                items, back, pids = list(chunk), len(chunk), []
            if back:
                self._mixed(items)
                continue
            for pid in pids:
                self._snapshot(pid)
            self._batch.extend(items)
            if len(self._batch) >= _CHUNK:
                self._flush(with_maps=False)

    def _mixed(self, items: list[object]) -> None:
        """Decoded events and handed-back records, in their order, as :meth:`_on_raw` takes them one by one."""
        for item in items:
            if type(item) is bytes:
                self._on_raw(item)
            else:
                self._take(item)

    def _take(self, ev: object) -> None:
        """One decoded event into the batch: its process read first when new, the batch handed on when full."""
        pid = getattr(ev, "pid", None)
        if pid is not None and pid not in self._seen_pids:
            self._snapshot(pid)
        self._batch.append(ev)
        if len(self._batch) >= _CHUNK:
            self._flush(with_maps=False)

    def _lifecycle(self, etype: int, raw: bytes) -> None:
        """exec (3): read the process's identity now; library open (2): attach, resume;
        exit (1): held until the call records submitted before it are read (see _run): it
        comes on the lifecycle ring buffer, which epoll may report before the events ring
        that still holds the process's last calls."""
        if etype == 2:
            loaded = self._library_opened(raw)
            if loaded is not None:
                self._batch.append(loaded)
            return
        _, pid, ts, comm = _EXIT.unpack_from(raw)
        if etype == 3:
            self._snapshot(pid, refresh=True, exec_ns=ts)
        elif etype == 1:
            self.process_exited(pid)
            self._exits.append(ProcessExit(pid, self.clock.to_epoch_ns(ts),
                                           comm.split(b"\0", 1)[0].decode(errors="replace"), -1,
                                           source=self.name))

    def _snapshot(self, pid: int, *, refresh: bool = False, exec_ns: int | None = None) -> None:
        """Read the process's /proc identity now, while it is alive (bounded memory of pids); at an exec
        (``refresh``, ``exec_ns``: the record's ts) once for all receivers (ResourceCache.refresh)."""
        self.process_seen(pid, refresh)
        self._seen_pids[pid] = None
        if len(self._seen_pids) > 65536:
            self._seen_pids.popitem(last=False)
        cache = self.ctx.resources
        if cache is not None:
            if refresh:
                cache.refresh(pid, exec_ns)  # exec keeps pid and start time, but not the program
            else:
                cache.get(pid)

    def _library_opened(self, raw: bytes) -> LibraryLoaded | None:
        """A library open that succeeded (reported at openat's exit, before the file is mapped): attached
        when the path is a regular file, and the process resumed if it was paused for it. None for a path
        that is no regular file (a directory the pattern matched, or a file gone since)."""
        _, paused, pid, tid, ts, path_b = _LIBOPEN.unpack_from(raw)
        path = path_b.split(b"\0", 1)[0].decode(errors="replace")
        if paused:
            self._pauses.opened(pid)
        self._snapshot(pid)
        found = False
        try:
            full = path if path.startswith("/") else os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
            root = f"/proc/{pid}/root{full}"
            target = root if os.path.exists(root) else full
            found = os.path.isfile(target)
            if found:
                self.attach_library(target)
        except OSError as exc:
            log.warning("%s: pid %d opened %s but it cannot be attached: %s", self.name, pid, path, exc)
        finally:
            if paused:
                self._resume(pid, ts)
        return LibraryLoaded(pid, tid, self.clock.to_epoch_ns(ts), path) if found else None

    def _resume(self, pid: int, ts: int | None = None) -> None:
        """SIGCONT ``pid`` stopped at ``ts`` (None: every stop of it): see PauseOnLoad.resume."""
        self._pauses.resume(self._bpf, pid, ts)

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

    def _read_drops(self, final: bool = False) -> None:
        for reason, n in self._array_deltas("drops", DROP_REASONS, self._drops_seen):
            self.ctx.telemetry.dropped(self.name, reason, n)
        now = time.monotonic()
        if final or now >= self._skips_due:  # an fdinfo read a program: every few seconds, and last
            self._skips_due = now + _SKIPS_EVERY_S
            self._read_skips()
        if self._pauses.guarded:
            for reason, n in self._array_deltas("oe_pause_skips", SKIP_REASONS, self._pauses.skips_seen):
                self.ctx.telemetry.add(PAUSES_SKIPPED, n, receiver=self.name, reason=reason)

    def _read_skips(self) -> None:
        """Runs of this receiver's programs the kernel skipped (otel_ebpf.bpf.skips), counted in
        ``otel_ebpf.bpf.runs_skipped{receiver,program}``; each program said once at INFO. Not a drop:
        the kernel does not say whose event a skipped run was (most are the agent's own threads' wakeups)."""
        bpf = self._bpf
        if bpf is None:
            return
        programs = [(_prog_name(name), fn.fd) for name, fn in list(bpf.funcs.items())]
        for prog, n in self._skips.read(programs):
            self.ctx.telemetry.add(RUNS_SKIPPED, n, receiver=self.name, program=prog)
            if prog not in self._skips_said:
                self._skips_said.add(prog)
                log.info("%s: the kernel skipped %d run(s) of its %s program (another BPF program was running on "
                         "that CPU); counted in %s", self.name, n, prog, RUNS_SKIPPED)

    def _array_deltas(self, table: str, names: Sequence[str], seen: list[int]) -> list[tuple[str, int]]:
        """(name, growth since the last read) of each counter of BPF array ``table`` that grew
        (otel_ebpf.bpf.maps.array_deltas on this receiver's program)."""
        return array_deltas(self._bpf[table], names, seen)

    def _run(self) -> None:
        rings = self._rings
        assert rings is not None  # made before the thread starts
        while not self._stop.is_set():
            try:
                self._pauses.renew()  # this loop resumes: while it turns, stops may be made
                turn = time.monotonic()
                rings.poll(self._poll_ms)
                self._pauses.confirm(self._bpf)
                exits, self._exits = self._exits, []
                rings.consume()  # records submitted without a wakeup
                self._batch.extend(exits)  # after every call record submitted before them
                now = time.monotonic()
                if now >= self._drops_due:  # BCC's map reads cost ~100 us: not every turn (_drain reads last)
                    self._drops_due = now + _DROPS_EVERY_S
                    self._read_drops()
                    self.check_clock()
                busy = bool(self._batch)
                self._flush()
                if busy:  # records keep coming: let them gather in the ring buffer a little (fewer, bigger batches)
                    self._stop.wait(_MIN_TURN_S - (time.monotonic() - turn))
            except Exception:
                log.exception("%s: poll loop error", self.name)
        self._drain(rings)

    def check_clock(self) -> None:
        """Ask the agent's clock whether the wall clock was stepped (otel_ebpf.bpf.clock): a step found here is
        counted (``otel_ebpf.clock.steps{receiver}``) and logged, once for all receivers. Poll thread."""
        step = self.clock.check()
        if step:
            self.ctx.telemetry.add("otel_ebpf.clock.steps", 1, receiver=self.name)
            log.warning("%s: the wall clock was stepped by %+.3f ms; span times follow it from now on (records "
                        "read before keep the old offset)", self.name, step / 1e6)

    def _drain(self, rings: Rings) -> None:
        try:
            rings.consume()
            exits, self._exits = self._exits, []
            rings.consume()
            self._batch.extend(exits)
            self._read_drops(final=True)
            self._flush()
        except Exception:
            log.exception("%s: final drain failed", self.name)

    # Set by the agent when this process exits right after shutdown (the CLI): uprobes are then
    # released by a detached child instead of here (see release_uprobes_in_background).
    detach_in_background = False

    def shutdown(self) -> None:
        self._pauses.revoke()  # no new stops from here on
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        held = paused_map.hold(self._bpf) if self._bpf is not None else None
        for pid in list(self._pauses.stopped):
            self._resume(pid)
        if self._rings is not None:
            self._rings.close()
            self._rings = None
        if self._links is not None:
            self._links.close()  # in parallel: ~0.2 s for a hundred (bpf/links)
            self._links = None
        if self._bpf is not None and self.detach_in_background:
            release_uprobes_in_background(self._bpf)
        if self._bpf is not None:
            try:
                self._bpf.cleanup()
            except Exception:
                log.debug("%s: cleanup failed", self.name, exc_info=True)
            self._bpf = None
        self._pauses.release(held)  # programs detached: no new stops
        threadctx.release(self._ctx_pin)
        self._ctx_pin = None

    def add_target(self, pid: int) -> None:
        """Trace one more process tree (used by ``run -- CMD`` after fork, before exec)."""
        if self._bpf is not None:
            self._bpf["traced"][ct.c_uint32(pid)] = ct.c_uint8(1)

    @property
    def bpf(self) -> Any:
        return self._bpf



