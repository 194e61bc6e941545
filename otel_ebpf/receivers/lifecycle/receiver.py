"""The lifecycle receiver: fork, exec (with argv) and exit_group of traced processes
(lifecycle.bpf.c) -> typed events (events.py).

Records arrive through the ring buffer; the exit itself is the common part's
:class:`~otel_ebpf.core.events.ProcessExit` (``source="lifecycle"``). Nothing is read from
``/proc`` here beyond what the base does for every receiver (a process's identity at its first
record and at exec): argv comes from the kernel. Each fork and exec is also handed, as it is
decoded, to the resource cache (``ResourceCache.hint``), so a process that exits before its
``/proc`` could be read still gets its parent pid, command line and executable on its resource.

Threading: ``decode`` runs on the receiver's own poll thread only; it raises on a malformed record
(the base counts it as ``decode_error``).
"""
from __future__ import annotations

import logging
import struct
from pathlib import Path

from typing import TYPE_CHECKING, Any

from otel_ebpf.bpf.newtask import attach_newtask, compile_offsets, newtask_offsets
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.pipeline import Consumer, Context

from .config import Config
from .events import LifecycleExec, LifecycleExitCode, LifecycleFork

if TYPE_CHECKING:
    from otel_ebpf.bpf.gate_hosted import HostedGate

__all__ = ["EXEC", "EXIT_CODE", "FORK", "MIRRORS", "LifecycleReceiver"]

log = logging.getLogger(__name__)
_ARGS_LEN = 1024  # LC_ARGS_LEN
# The common part's exit/exec ring (OE_LIFECYCLE_PAGES, 16 pages elsewhere: ~1,600 records of 40 bytes). This
# receiver's spans end at those exits, and a storm of short processes (tests/faults/test_load.py, 10,000
# forks) filled 16 pages while the agent was busy: 128 pages (512 KiB) hold ~13,000.
_EXIT_RING_PAGES = 128

FORK = Mirror("lc_fork_rec", 48, struct.Struct("<B3xII4xQ16s"), ("type", "pid", "ppid", "ts", "comm"))
EXEC = Mirror("lc_exec_rec", 49, struct.Struct("<BBHIIIQ256s1280s"),
              ("type", "truncated", "argc", "pid", "tid", "args_len", "ts", "filename", "args"))
EXIT_CODE = Mirror("lc_exit_code_rec", 50, struct.Struct("<B3xIi4xQ"), ("type", "pid", "code", "ts"))
MIRRORS: tuple[Mirror, ...] = (FORK, EXEC, EXIT_CODE)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


class LifecycleReceiver(BpfReceiver):
    """Receiver ``lifecycle``: fork, exec and exit code of the processes in ``ctx.target_pids``
    and their descendants (every process when there are none)."""

    name = "lifecycle"
    start_early = True  # the command's forks, execs and exits from its first instruction (deferred start)
    src_file = Path(__file__).with_name("lifecycle.bpf.c")

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages)
        self.config = config
        self._offsets: tuple[int, int] | None = None
        self._gate: HostedGate | None = None

    # ---- hosting a deferred start's library gate (otel_ebpf.bpf.gate_hosted) -----------------
    can_host_gate = True

    def host_gate(self, gate: HostedGate) -> None:
        """Compile the gate into this program (before :meth:`start`): one compile instead of two."""
        self._gate = gate

    def program_cflags(self) -> list[str]:
        flags = super().program_cflags()
        if self._gate is None:
            return flags
        return [f for f in flags if not f.startswith("-DOE_PAUSE_ON_LOAD=")] + self._gate.host_cflags()

    def _load(self) -> Any:
        if self._gate is None:
            return super()._load()
        self._gate.prepare()
        try:
            return super()._load()
        except BaseException:
            self._gate.unprepare()
            raise

    def _library_opened(self, raw: bytes) -> None:
        """Only the gate's patterns are watched here: its records go to the gate's thread."""
        if self._gate is not None:
            self._gate.enqueue(raw)

    def cflags(self) -> list[str]:
        offsets = compile_offsets(self._offsets)
        return [f"-DLC_NEWTASK_PID_OFF={offsets[0]}", f"-DLC_NEWTASK_FLAGS_OFF={offsets[1]}",
                f"-DLC_EXEC_PENDING={self.config.max_pending_execs}", f"-DOE_LIFECYCLE_PAGES={_EXIT_RING_PAGES}"]

    def start(self) -> None:
        if self.bpf is not None:
            return
        self._offsets = newtask_offsets()
        super().start()
        attach_newtask(self, "lc_newtask", lost="forks are not seen")

    def decode(self, etype: int, raw: bytes) -> object | None:
        """One record -> one event. Raises on a malformed record (the base counts it)."""
        to_epoch = self.clock.to_epoch_ns
        # what the kernel saw, for a process gone before /proc is read (core.services.ProcessResources.hint)
        hint = None if self.ctx.resources is None else self.ctx.resources.hint
        if etype == FORK.etype:
            _, pid, ppid, ts, comm = FORK.fmt.unpack_from(raw)
            if hint is not None:
                hint(pid, ts, ppid=ppid)
            return LifecycleFork(pid, ppid, to_epoch(ts), _cstr(comm))
        if etype == EXEC.etype:
            _, truncated, argc, pid, tid, args_len, ts, filename, args = EXEC.fmt.unpack_from(raw)
            parts = args[:min(args_len, _ARGS_LEN)].split(b"\0")
            argv = tuple(p.decode(errors="replace") for p in parts[:argc])
            if hint is not None:  # before the event goes on: the process may be gone before /proc is read
                hint(pid, ts, filename=_cstr(filename), argv=argv)
            return LifecycleExec(pid, tid, to_epoch(ts), _cstr(filename), argv, bool(truncated))
        if etype == EXIT_CODE.etype:
            _, pid, code, ts = EXIT_CODE.fmt.unpack_from(raw)
            return LifecycleExitCode(pid, to_epoch(ts), code)
        raise ValueError(f"unknown lifecycle record type {etype}")
