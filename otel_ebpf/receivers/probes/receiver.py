"""The user-declared probes receiver: a BPF program generated from validated entries
(:mod:`.codegen`) -> :class:`~.events.ProbeHit` events.

Start: entries are resolved again against the host (:mod:`.targets`; the config may have
been checked elsewhere), the program is compiled, then uprobes/uretprobes attach by symbol,
USDT locations attach as uprobes with their semaphore as reference counter
(:mod:`.attach`), tracepoints through BCC. An entry that cannot attach is a warning naming
the library and symbol (fatal with ``strict``).

Threading: ``decode`` runs on the poll thread only and raises only for a malformed record
(the base counts it as ``decode_error``).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from otel_ebpf.bpf.loader import COMMON_SRC
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.errors import AttachError
from otel_ebpf.core.pipeline import Consumer, Context

from otel_ebpf.bpf.refctr import RefCtrUprobes
from .codegen import FLAG_SPAN, HEAD, UP_EV_HIT, Layout, generate, layout
from .config import Config
from .events import ProbeHit
from .targets import Resolved, resolve_all

__all__ = ["UserProbesReceiver"]

log = logging.getLogger(__name__)
_SIGN = {"s8": 8, "s16": 16, "s32": 32, "s64": 64}
_MASK = {"u8": 0xFF, "u16": 0xFFFF, "u32": 0xFFFFFFFF, "u64": (1 << 64) - 1, "bool": 1, "pointer": (1 << 64) - 1}


def _scalar(type_name: str, raw: int) -> int | bool | str:
    if type_name == "bool":
        return bool(raw)
    if type_name == "pointer":
        return hex(raw)
    bits = _SIGN.get(type_name)
    if bits is not None:
        raw &= (1 << bits) - 1
        return raw - (1 << bits) if raw >> (bits - 1) else raw
    return raw & _MASK[type_name]


class UserProbesReceiver(BpfReceiver):
    """Receiver ``probes``. With no entries it loads nothing."""

    name = "probes"
    start_early = True  # probes the user named: what they probe may run from the first instruction
    src_file = Path(__file__).with_name("probes.generated.bpf.c")  # never on disk: see source()

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages, poll_interval=config.poll_interval)
        self.config = config
        self._resolved: list[Resolved] | None = None
        self._layouts: list[Layout] = [layout(p.args) for p in config.probes]
        self._refctr = RefCtrUprobes()

    def resolved(self) -> list[Resolved]:
        if self._resolved is None:
            self._resolved = resolve_all(self.config.probes, "receivers.probes.probes")
        return self._resolved

    def cflags(self) -> list[str]:
        return [f"-DUP_MAX_INFLIGHT={self.config.max_inflight}"]

    def source(self) -> str:
        return (f"// ---- {COMMON_SRC.name}\n{COMMON_SRC.read_text()}\n// ---- generated\n"
                f"{generate(self.resolved())}")

    def start(self) -> None:
        if self._bpf is not None or not self.config.probes:
            return
        super().start()
        for p, r in enumerate(self.resolved()):
            self._attach(p, r)

    def _attach(self, p: int, r: Resolved) -> None:
        spec, bpf = r.spec, self._bpf
        what = (r.path or "tracefs", spec.symbol or spec.tracepoint or f"{spec.provider}:{spec.probe}")
        try:
            if spec.kind == "tracepoint":
                bpf.attach_tracepoint(tp=spec.tracepoint, fn_name=f"up_{p}_tp")
            elif spec.kind == "usdt":

                for j, site in enumerate(r.sites):
                    self._refctr.attach_function(bpf, f"up_{p}_loc{j}", site.path, site.offset,
                                                 site.semaphore_offset)
            else:
                if spec.kind == "uprobe":
                    self._attach_uprobe(r.path, spec.symbol, f"up_{p}_entry", False)
                if spec.kind == "uretprobe" or spec.span:
                    self._attach_uprobe(r.path, spec.symbol, f"up_{p}_return", True)
            self.ctx.telemetry.add("otel_ebpf.probes.attached", 1, receiver=self.name,
                                   library=os.path.basename(what[0]))
        except Exception as exc:
            self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name,
                                   library=os.path.basename(what[0]))
            err = AttachError(what[0], what[1], str(exc).strip() or type(exc).__name__)
            if self.ctx.strict:
                raise err from None
            log.warning("%s: probe %s: %s", self.name, spec.name, err)

    def decode(self, etype: int, raw: bytes) -> object | None:
        if etype != UP_EV_HIT:
            raise ValueError(f"unknown user probe record type {etype}")
        _, p, flags, pid, tid, start, end = HEAD.unpack_from(raw)
        spec, lay = self.config.probes[p], self._layouts[p]
        values = lay.fmt.unpack_from(raw, HEAD.size)
        args: list[tuple[str, Any]] = []
        for (name, kind, type_name), v in zip(lay.args, values, strict=True):
            if kind == "str":
                args.append((name, v.split(b"\0", 1)[0].decode(errors="replace")))
            else:
                args.append((name, _scalar(type_name, v)))
        to_epoch = self.clock.to_epoch_ns
        return ProbeHit(pid, tid, spec.name, spec.kind, to_epoch(start), to_epoch(end), bool(flags & FLAG_SPAN),
                        tuple(args), spec.metric, spec.value)

    def shutdown(self) -> None:
        self._refctr.close()  # before the programs go: the semaphores drop back to 0
        super().shutdown()
