"""The PyTorch receiver: uprobes on libtorch_cpu's at::_ops::<op>::call (torch.bpf.c) ->
:class:`TorchOp` events.

The library is found per process (``/proc/PID/maps``, ``torch/lib`` of the traced command's
Python environment, config) and, since ``import torch`` opens it lazily, caught at ``openat``
in the kernel (the process is held until the probes are attached). The operators' symbols
are read from the library's symbol table once per library (BCC, about half a second for the
430 MB libtorch_cpu.so of torch 2.13), then each gets a uprobe and a uretprobe. One BPF
function serves them all; records carry the entry address, mapped back to the operator here
through the process's ``/proc/PID/maps`` (cached per process, bounded). With ``steps``, the same
symbol scan finds the step markers' functions (record_function_enter_new: uprobe + uretprobe;
record_function_exit_new: uprobe), attached both or neither; step records become
:class:`TorchStep` events (the package docstring says how steps are cut).

Threading: ``decode`` runs on the poll thread; attaching holds the base's attach lock.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from otel_ebpf.bpf import threadctx
from otel_ebpf.bpf.attach import claim_library
from otel_ebpf.bpf.maps import array_deltas
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.errors import AttachError
from otel_ebpf.core.ids import TORCH_ROOT_PYTHON, TORCH_ROOT_STEP
from otel_ebpf.host.libraries import mapped_libraries
from otel_ebpf.core.pipeline import Consumer, Context

from otel_ebpf.host.libraries import interpreter_of_command
from otel_ebpf.bpf.python_usdt import attach_fn
from otel_ebpf.bpf.usdt import vaddr_to_offset
from .config import Config
from .events import STEP_END_REASONS, TorchOp, TorchStep

__all__ = ["LIB_PATTERN", "MARKER_REGEX", "OP", "STEP", "TorchReceiver", "op_symbol_regex"]

log = logging.getLogger(__name__)
LIB_PATTERN = "libtorch_cpu.so"
_MAX_PIDS = 4096  # processes whose libtorch mappings are cached
_COUNTS = ("stack_too_deep", "unpaired_returns")  # torch.bpf.c TORCH_CNT_* order


OP = Mirror("torch_op_rec", 128, struct.Struct("<B3xIIIQQQQQ"),
            ("type", "pid", "tid", "depth", "start_ns", "end_ns", "parent_start", "root_start", "ip"))
STEP = Mirror("torch_step_rec", 129, struct.Struct("<BB2xIIIQQQ"),
              ("type", "reason", "pid", "tid", "ops", "start_ns", "end_ns", "seq"))
_CUT = ("max_duration", "max_ops")  # STEP_END_REASONS that a bound forced: counted
_TAGS = TORCH_ROOT_PYTHON | TORCH_ROOT_STEP


# torch/csrc/autograd/record_function_ops.cpp (torch 2.x): record_function_enter_new is exported,
# record_function_exit_new is static (found in .symtab: an 'L' in its mangled name)
MARKER_REGEX = rb"^_ZN5torch8autograd8profilerL?(?:25record_function_enter_new|24record_function_exit_new)E[^.]*$"
_MARKER_SYM = re.compile(rb"^_ZN5torch8autograd8profilerL?\d+(record_function_(?:enter|exit)_new)E")
_OP_FUNCS = (("torch_op_enter", 0), ("torch_op_return", 1))
_MARKER_FUNCS = {"record_function_enter_new": (("torch_rf_enter", 0), ("torch_rf_entered", 1)),
                 "record_function_exit_new": (("torch_rf_exit", 0),)}


def op_symbol_regex(ops: list[str]) -> bytes:
    """Mangled ``at::_ops::<op>::call(...)`` for each op (Itanium ABI: <length><name>), not the
    compiler's ``.cold`` split parts."""
    alts = "|".join(f"{len(op)}{re.escape(op)}" for op in ops)
    return f"^_ZN2at4_ops(?:{alts})4callE[^.]*$".encode()


_SYM = re.compile(rb"^_ZN2at4_ops(\d+)")


def _op_name(symbol: bytes) -> str:
    m = _SYM.match(symbol)
    if not m:
        return symbol.decode(errors="replace")
    n = int(m.group(1))
    return symbol[m.end():m.end() + n].decode(errors="replace")


class TorchReceiver(BpfReceiver):
    """Receiver ``torch``: one :class:`TorchOp` per call of a configured operator."""

    name = "torch"
    src_file = Path(__file__).with_name("torch.bpf.c")
    lib_pattern = LIB_PATTERN
    thread_context = True  # writes the thread's innermost open operator for the cuda program (common.bpf.c)

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages, pause_on_load=config.pause_on_load,
                         extra_libraries=config.libraries, poll_interval=config.poll_interval)
        self.config = config
        ctx.thread_ctx_writers.add(self.name)  # the cuda program reads the map only then
        self._ops: dict[tuple[int, int], dict[int, str]] = {}  # (st_dev, st_ino) -> file offset -> op
        self._maps: OrderedDict[int, list[tuple[int, int, int, tuple[int, int]]]] = OrderedDict()
        self._counts_seen = [0] * len(_COUNTS)
        self._maps_lock = threading.Lock()  # op_at: this poll thread and the cuda receiver's (threadctx)

    def start(self) -> None:
        if self.bpf is None:
            threadctx.register_ops(self.ctx, self.op_at)  # the cuda receiver names launch counters with it
        super().start()

    def shutdown(self) -> None:
        super().shutdown()
        threadctx.unregister_ops(self.ctx)

    def cflags(self) -> list[str]:
        c = self.config
        return [f"-DTORCH_MAX_DEPTH={c.max_depth}", f"-DTORCH_MAX_THREADS={c.max_threads}",
                f"-DTORCH_MIN_DURATION_NS={int(c.min_duration * 1e9)}", f"-DTORCH_STEPS={int(c.steps)}",
                f"-DTORCH_STEP_GAP_NS={int(c.step_gap * 1e9)}ULL",
                f"-DTORCH_STEP_MAX_NS={int(c.step_max_duration * 1e9)}ULL", f"-DTORCH_STEP_MAX_OPS={c.step_max_ops}"]

    # ---- libraries -------------------------------------------------------------------------
    def initial_libraries(self, pids: Sequence[int] = ()) -> list[str]:
        paths = list(self._extra_libs)
        for pid in pids or self.ctx.target_pids:
            paths += mapped_libraries(pid, LIB_PATTERN)
        python = interpreter_of_command(list(self.ctx.libraries.get("command", [])))
        if python and os.path.basename(python).startswith("python"):
            from otel_ebpf.host.libraries import _python_site_dirs

            for d in _python_site_dirs(python):
                paths += glob.glob(os.path.join(d, "torch", "lib", LIB_PATTERN))
        out: list[str] = []
        for p in paths:
            real = os.path.realpath(p)
            if os.path.isfile(real) and real not in out:
                out.append(real)
        return out

    def attach_library(self, path: str) -> int:
        """Uprobe + uretprobe on every configured operator found in ``path``, and the step markers'
        probes (``steps``). Safe to call twice."""
        from bcc import BPF

        with self._attach_lock:  # held while attaching: BCC's attach calls are not thread-safe
            real = claim_library(self._attached, path, self._bpf is not None)
            if real is None:
                return 0
            try:
                st = os.stat(real)
                found = BPF.get_user_functions_and_addresses(real.encode(), self._symbol_regex())
            except Exception as exc:
                self._attach_failed(real, "at::_ops symbols", str(exc))
                return 0
            offsets: dict[int, str] = {}
            markers: dict[str, int] = {}
            n = 0
            for sym, vaddr in found:
                try:
                    off = vaddr_to_offset(real, vaddr)
                    marker = _MARKER_SYM.match(sym)
                    if marker:
                        markers[marker.group(1).decode()] = off
                    elif off not in offsets:  # else listed in both .dynsym and .symtab
                        n += self._attach_at(real, off, _OP_FUNCS)
                        offsets[off] = _op_name(sym)
                except Exception as exc:
                    self._attach_failed(real, sym.decode(errors="replace"), str(exc))
            self._ops[(st.st_dev, st.st_ino)] = offsets
            if self.config.steps:
                n += self._attach_markers(real, markers)
        missing = sorted(set(self.config.ops) - set(offsets.values()))
        if missing:
            log.warning("torch: %s has no at::_ops::X::call for %s (not traced)", real, ", ".join(missing))
        self.ctx.telemetry.add("otel_ebpf.probes.attached", n, receiver=self.name, library=os.path.basename(real))
        log.info("torch: attached %d probes (%d operators) to %s", n, len(offsets), real)
        return n

    def _symbol_regex(self) -> bytes:
        ops = op_symbol_regex(self.config.ops)
        return b"(?:" + ops + b")|(?:" + MARKER_REGEX + b")" if self.config.steps else ops

    def _attach_markers(self, path: str, found: dict[str, int]) -> int:
        """The record_function probes (step markers), both or neither: an Optimizer.step# scope seen
        entering but never exiting would leave its thread's steps to the bounds alone."""
        if set(found) != set(_MARKER_FUNCS):
            log.warning("torch: %s has no %s (its symbol table is stripped?): steps end by gaps and bounds only, "
                        "not at Optimizer.step / ProfilerStep", path,
                        " or ".join(sorted(set(_MARKER_FUNCS) - set(found))))
            return 0
        n = 0
        for name, off in found.items():
            try:
                n += self._attach_at(path, off, _MARKER_FUNCS[name])
            except Exception as exc:
                self._attach_failed(path, name, str(exc))
        return n

    def _attach_at(self, path: str, offset: int, funcs: tuple[tuple[str, int], ...]) -> int:
        """``funcs``: (BPF function, 0 uprobe / 1 uretprobe) to attach at ``offset`` of ``path``."""
        attach = attach_fn()
        n = 0
        for fn_name, kind in funcs:
            fn = self._bpf.load_func(fn_name.encode(), self._bpf.KPROBE)
            ev = f"{'pr'[kind]}_oe_torch_{os.stat(path).st_ino:x}_{offset:x}".encode()
            fd = attach(fn.fd, kind, ev, path.encode(), offset, -1, 0)
            if fd < 0:
                raise OSError(f"perf_event_open for the uprobe at offset {offset:#x} failed")
            self._bpf._add_uprobe_fd(ev, fd)
            n += 1
        return n

    def _attach_failed(self, path: str, symbol: str, reason: str) -> None:
        self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name, library=os.path.basename(path))
        err = AttachError(path, symbol, reason)
        if self.ctx.strict:
            raise err
        log.warning("torch: %s", err)

    # ---- records ---------------------------------------------------------------------------
    def _mappings(self, pid: int, refresh: bool) -> list[tuple[int, int, int, tuple[int, int]]]:
        """(start, end, file offset, (dev, inode)) of pid's executable libtorch mappings."""
        if not refresh and pid in self._maps:
            return self._maps[pid]
        out = []
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or "x" not in parts[1] or LIB_PATTERN not in parts[5]:
                        continue
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    st = os.stat(f"/proc/{pid}/map_files/{parts[0]}")
                    out.append((start, end, int(parts[2], 16), (st.st_dev, st.st_ino)))
        except OSError:
            pass
        self._maps[pid] = out
        self._maps.move_to_end(pid)
        if len(self._maps) > _MAX_PIDS:
            self._maps.popitem(last=False)
        return out

    def op_at(self, pid: int, ip: int) -> str | None:
        """The operator whose entry address in ``pid`` is ``ip``, or None. Thread-safe."""
        with self._maps_lock:
            for refresh in (False, True):
                for start, end, off, ident in self._mappings(pid, refresh):
                    if start <= ip < end:
                        return self._ops.get(ident, {}).get(ip - start + off)
        return None

    def decode(self, etype: int, raw: bytes) -> object | None:
        if etype == STEP.etype:
            return self._decode_step(raw)
        if etype != OP.etype:
            raise ValueError(f"unknown PyTorch record type {etype}")
        _, pid, tid, depth, start, end, parent, root, ip = OP.fmt.unpack_from(raw)
        op = self.op_at(pid, ip)
        if op is None:
            self.ctx.telemetry.dropped(self.name, "unknown_op_address")
            return None
        to_epoch = self.clock.to_epoch_ns
        return TorchOp(pid, tid, op, depth, to_epoch(start), to_epoch(end), to_epoch(parent) if parent else 0,
                       to_epoch(root & ~_TAGS) | (root & _TAGS))

    def _decode_step(self, raw: bytes) -> TorchStep:
        _, reason, pid, tid, ops, start, end, seq = STEP.fmt.unpack_from(raw)
        if not 0 < reason < len(STEP_END_REASONS):
            raise ValueError(f"unknown step end reason {reason}")
        why = STEP_END_REASONS[reason]
        if why in _CUT:
            self.ctx.telemetry.add("otel_ebpf.torch.steps_cut", 1, receiver=self.name, reason=why)
        to_epoch = self.clock.to_epoch_ns
        return TorchStep(pid, tid, to_epoch(start), to_epoch(end), ops, seq, why)

    def poll_maps(self) -> list[object]:
        if self.bpf is None:
            return []
        try:
            for reason, delta in array_deltas(self.bpf["torch_counts"], _COUNTS, self._counts_seen):
                if reason == "stack_too_deep":
                    self.ctx.telemetry.dropped(self.name, reason, delta)
                else:
                    self.ctx.telemetry.add("otel_ebpf.torch.unpaired_returns", delta, receiver=self.name)
        except Exception:
            self.ctx.telemetry.dropped(self.name, "map_read_error")
        return []
