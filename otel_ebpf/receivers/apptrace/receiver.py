"""The application tracepoints receiver: the SDK's USDT probe ``otel_ebpf:event``
(:mod:`otel_ebpf.tracepoints`) -> :class:`~.events.AppPoint` / :class:`~.events.AppSpan`, and
the per-thread current app span (:class:`~.store.AppContextStore` on ``ctx.app_context``) that
other processors parent their spans on.

Attach: every copy of the extension (the agent's own, ``libraries``, those mapped by processes,
those opened later: ``_oetp.`` at openat) gets a uprobe at each probe location, opened with the
semaphore as reference counter (otel_ebpf/bpf/refctr.py), so ``probe.enabled`` turns true in
every process using that file while the agent runs. The argument-reading code is generated
from the ELF note of each copy (compiler-chosen operands); a copy opened later whose operands
differ from every compiled variant is not attached (warning, ``otel_ebpf.probes.failed``).

Threading: ``decode`` runs on the poll thread only; it raises only for a malformed record.
"""
from __future__ import annotations

import json
import logging
import os
import random
import struct
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_ebpf.bpf.attach import claim_library
from otel_ebpf.bpf.loader import COMMON_SRC
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.errors import AttachError
from otel_ebpf.core.services import AppContext
from otel_ebpf.core.pipeline import Consumer, Context

from otel_ebpf.bpf.refctr import RefCtrUprobes
from otel_ebpf.bpf.usdt import ArgLoc, Site, UsdtError, arg_reader, find_site
from .config import Config
from .events import AppPoint, AppSpan
from .store import AppContextStore

__all__ = ["PROBE", "RECORD", "AppTraceReceiver", "sdk_library"]

log = logging.getLogger(__name__)
PROBE = ("otel_ebpf", "event")
AT_EV_EVENT = 145
RECORD = Mirror("at_rec", AT_EV_EVENT, struct.Struct("<BB2xII4xQQQQQ32s32s256s"),
                ("type", "kind", "pid", "tid", "ts", "trace_hi", "trace_lo", "parent", "span", "provider", "name",
                 "payload"))
_NARGS = 8


def sdk_library() -> str | None:
    """The agent's own copy of the SDK extension, when it is built."""
    from otel_ebpf import tracepoints
    mod = getattr(tracepoints, "_oetp", None)
    return os.path.realpath(mod.__file__) if mod is not None and getattr(mod, "__file__", None) else None


def _mapped(pid: int) -> list[str]:
    out = []
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("_oetp.") and path.startswith("/"):
                    out.append(f"/proc/{pid}/root{path}")
    except OSError:
        pass
    return out


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _args(payload: bytes) -> tuple[tuple[str, Any], ...]:
    try:
        data = json.loads(_text(payload) or "{}")
    except ValueError:
        return (("app.payload.error", "not JSON"),)
    if not isinstance(data, dict):
        return (("app.payload.error", "not an object"),)
    return tuple((str(k), v) for k, v in data.items() if isinstance(v, (str, int, float, bool)))


class AppTraceReceiver(BpfReceiver):
    """Receiver ``apptrace``."""

    name = "apptrace"
    start_early = True  # no pause_on_load: a tracepoint library opened before the receiver loads would run untraced
    src_file = Path(__file__).with_name("apptrace.generated.bpf.c")  # never on disk: see source()
    lib_pattern = "_oetp."

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages, poll_interval=config.poll_interval,
                         extra_libraries=config.libraries)
        self.config = config
        if ctx.app_context is None:
            ctx.app_context = AppContextStore(ctx.telemetry, max_threads=config.max_threads)
        self.store: AppContext = ctx.app_context
        self._refctr = RefCtrUprobes()
        self._variants: dict[tuple[ArgLoc, ...], int] = {}
        self._sites: dict[str, list[Site]] = {}
        self._open: OrderedDict[tuple[int, int], tuple[int, int, int, AppPoint]] = OrderedDict()

    # ---- program -----------------------------------------------------------------------
    def initial_libraries(self, pids: Sequence[int] = ()) -> list[str]:
        paths = [*self._extra_libs]
        own = sdk_library()
        if own:
            paths.append(own)
        for pid in pids or self.ctx.target_pids or [int(d) for d in os.listdir("/proc") if d.isdigit()]:
            paths += _mapped(pid)
        seen, out = set(), []
        for p in paths:
            real = os.path.realpath(p)
            if real not in seen and os.path.isfile(p):
                seen.add(real)
                out.append(p)
        return out

    def _sites_of(self, path: str) -> list[Site]:
        real = os.path.realpath(path)
        if real not in self._sites:
            self._sites[real] = find_site(path, *PROBE)
        return self._sites[real]

    def source(self) -> str:
        parts = [f"// ---- {COMMON_SRC.name}\n{COMMON_SRC.read_text()}", '#include "apptrace.h"']
        for args, k in self._variants.items():
            site = Site("", 0, 0, args)
            reads = "\n".join(f"    u64 t{i} = 0;\n    {arg_reader(site, i, f't{i}')}" for i in range(_NARGS))
            parts.append(_FUNC.format(k=k, reads=reads))
        return "\n".join(parts) + "\n"

    def start(self) -> None:
        if self._bpf is not None:
            return
        for lib in self.initial_libraries():
            try:
                for site in self._sites_of(lib):
                    if len(site.args) == _NARGS:
                        self._variants.setdefault(site.args, len(self._variants))
            except UsdtError as exc:
                log.warning("%s: %s", self.name, exc)
        super().start()

    def attach_library(self, path: str) -> int:
        """Attach to every location of otel_ebpf:event in ``path``; returns how many attached."""
        with self._attach_lock:
            real = claim_library(self._attached, path, self._bpf is not None)
        if real is None:
            return 0
        n = 0
        try:
            for site in self._sites_of(path):
                k = self._variants.get(site.args)
                if k is None:
                    raise UsdtError(f"{path}: otel_ebpf:event operands differ from every compiled variant "
                                    "(a copy built differently); restart the agent to include it")
                self._refctr.attach_function(self._bpf, f"at_ev_{k}", path, site.offset, site.semaphore_offset)
                n += 1
        except (UsdtError, OSError) as exc:
            self.ctx.telemetry.add("otel_ebpf.probes.failed", 1, receiver=self.name, library=os.path.basename(real))
            err = AttachError(path, "otel_ebpf:event", str(exc))
            if self.ctx.strict:
                raise err from None
            log.warning("%s: %s", self.name, err)
        self.ctx.telemetry.add("otel_ebpf.probes.attached", n, receiver=self.name, library=os.path.basename(real))
        return n

    # ---- records -----------------------------------------------------------------------
    def decode(self, etype: int, raw: bytes) -> object | None:
        if etype != AT_EV_EVENT:
            raise ValueError(f"unknown apptrace record type {etype}")
        _, kind, pid, tid, ts, hi, lo, parent, span, prov, name, payload = RECORD.fmt.unpack_from(raw)
        t = self.clock.to_epoch_ns(ts)
        trace_id = (hi << 64) | lo
        if kind == 0:
            return AppPoint(pid, tid, _text(prov), _text(name), t, trace_id, parent, _args(payload))
        if kind == 1:  # remembered (and made current on the thread) until its end
            self._begin(pid, tid, t, trace_id, parent, span, AppPoint(
                pid, tid, _text(prov), _text(name), t, trace_id, parent, _args(payload)))
            return None
        if kind == 2:
            return self._end(pid, tid, t, span)
        raise ValueError(f"unknown apptrace fire kind {kind}")

    def _begin(self, pid: int, tid: int, t: int, trace_id: int, parent: int, span: int, ev: AppPoint) -> None:
        trace_id = trace_id or random.getrandbits(128) or 1  # an SDK without a trace id (older copy)
        if len(self._open) >= self.config.max_open_spans:  # the oldest never ended (its process died?)
            self._open.popitem(last=False)
            self.ctx.telemetry.dropped(self.name, "open_span_table_full")
        self._open[(pid, span)] = (t, trace_id, parent, ev)
        self.store.begin(pid, tid, t, trace_id, span)

    def _end(self, pid: int, tid: int, t: int, span: int) -> AppSpan | None:
        began = self._open.pop((pid, span), None)
        if began is None:  # begun before the agent attached, or not tracked
            self.ctx.telemetry.dropped(self.name, "end_without_begin")
            return None
        start, trace_id, parent, ev = began
        self.store.end(pid, tid, span, t)
        return AppSpan(pid, tid, ev.provider, ev.name, start, t, trace_id, span, parent, ev.attributes)

    def shutdown(self) -> None:
        self._refctr.close()  # the semaphores drop back to 0 in every process
        super().shutdown()


_FUNC = """
int at_ev_{k}(struct pt_regs *ctx)
{{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct at_rec *e = events.ringbuf_reserve(sizeof(struct at_rec));
    if (!e) {{
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }}
    __builtin_memset(e, 0, sizeof(*e));
{reads}
    e->type = AT_EV_EVENT;
    e->kind = (u8)t0;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->trace_hi = t3;
    e->trace_lo = t4;
    e->parent = t5;
    e->span = t6;
    bpf_probe_read_user_str(e->provider, sizeof(e->provider), (void *)t1);
    bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)t2);
    bpf_probe_read_user_str(e->payload, sizeof(e->payload), (void *)t7);
    /* a begin or an end wakes the reader at once: the current app span must be known before the
     * spans it parents are processed, and its end before the spans made after it (an end left in the
     * ring by a batched wakeup leaves the interval open, and the store matches an open interval to
     * every later call of the thread: a cudaMemcpy after the block was parented on it) */
    u64 flags = t0 != 0 ? BPF_RB_FORCE_WAKEUP : oe_wakeup_flags();
    events.ringbuf_submit(e, flags);
    return 0;
}}
"""
