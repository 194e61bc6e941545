"""The NVML receiver: GPU metrics every ``interval``, XID errors as they happen.

Threads (both daemons, both started by :meth:`NvmlReceiver.start`, which does not block):

* ``otel-ebpf-nvml``: loads NVML (``nvmlInit``, which can take seconds on a GPU without
  persistence mode: not on the agent's start path, where the traced command waits), finds the
  GPUs, then scrapes every ``interval`` and once more at shutdown, handing MetricRecords on.
* ``otel-ebpf-nvml-xid``: blocked in ``nvmlEventSetWait_v2`` (see :mod:`.xid`). Each XID becomes
  a ``hw.errors{error.type=xid_<n>}`` +1 record and one warning line.

Without NVML (no libnvidia-ml.so.1, driver not loaded, no permission, no nvidia-ml-py) the
receiver logs ONE line naming the cause and stops; the agent runs on: one failed dlopen, no
thread left running. On a host with no NVIDIA GPU on its PCI bus (:mod:`.presence`) that is the
expected path of the default pipeline, so the line is INFO ("no NVIDIA driver/GPU: NVML metrics
off"); on a host that has one it is a WARNING: its GPU metrics are missing.

``shutdown`` is safe without ``start`` and twice; it waits at most ``event_wait`` for the XID
thread and one scrape for the scrape thread, then calls nvmlShutdown.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import ModuleType

from otel_ebpf.host import gpus
from otel_ebpf.core.events import AttrValue, MetricRecord
from otel_ebpf.core.pipeline import Consumer, Context

from . import metrics as m
from .config import Config
from .presence import NO_GPU, nvidia_gpus
from otel_ebpf.host.nvml import load
from otel_ebpf.host.procfs import parent_pid
from .scrape import Scraper
from .xid import XID_MEANINGS, XidError, XidWatcher

__all__ = ["NvmlReceiver", "in_traced_tree"]

log = logging.getLogger(__name__)
_BACKPRESSURE_S = 1.0


def in_traced_tree(pid: int, roots: Sequence[int], follow_children: bool = True, max_depth: int = 64) -> bool:
    """True when ``pid`` is one of ``roots`` or (``follow_children``) descends from one."""
    current = pid
    for _ in range(max_depth):
        if current in roots:
            return True
        if not follow_children or current <= 1:
            return False
        parent = parent_pid(current)
        if parent is None:
            return False
        current = parent
    return False


class NvmlReceiver:
    """Receiver ``nvml`` (see the module docstring). ``disabled``: why NVML is not used, once known."""

    name = "nvml"

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        self.config = config
        self.ctx = ctx
        self.next = next_
        self.disabled: str | None = None
        self.scraper: Scraper | None = None
        self.ready = threading.Event()  # set once NVML is loaded (or known to be missing)
        self._nv: ModuleType | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._xid_thread: threading.Thread | None = None
        self._watcher: XidWatcher | None = None
        self._scope_pids: dict[int, bool] = {}
        self._xid_attrs: dict[str, dict[str, AttrValue]] = {}  # uuid -> GPU attributes, read by the XID thread
        if config.library and ctx.gpus is not None:
            gpus.attach(ctx, config.library)  # hw.id of CUDA/NCCL signals: the same NVML library

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="otel-ebpf-nvml", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)

    # ---- threads --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if not self._open():
                return
            while True:
                self.scrape_once()
                if self._stop.wait(self.config.interval):
                    break
            self.scrape_once()  # the last reading, so even a short run exports one full scrape
        except Exception:  # never take the agent down; say what happened once
            log.exception("nvml receiver stopped after an unexpected error")
        finally:
            self._close()
            self.ready.set()

    def _open(self) -> bool:
        nv, why = load(self.config.library)
        if nv is None:
            self.disabled = why
            on_pci = nvidia_gpus()
            if on_pci:
                log.warning("nvml receiver disabled, no GPU metrics although this host has %d NVIDIA GPU(s) (%s): %s",
                            len(on_pci), ", ".join(on_pci[:4]), why)
            else:
                log.info("%s: %s", NO_GPU, why)
            self.ready.set()
            return False
        self._nv = nv
        want = None if self.config.processes == "none" else self._want_pid
        self.scraper = Scraper(nv, self.ctx.telemetry, want_pid=want)
        self.scraper.discover()
        log.info("nvml: %d GPU(s) found", len(self.scraper.gpus))
        if self.config.xid_events and self.scraper.gpus:
            handles = {g.uuid: g.handle for g in self.scraper.gpus.values()}
            self._xid_attrs = {g.uuid: dict(g.attrs) for g in self.scraper.gpus.values()}
            self._watcher = XidWatcher(self.scraper.calls, handles, self._on_xid, self.config.event_wait)
            if self._watcher.active:
                self._xid_thread = threading.Thread(target=self._watcher.run, args=(self._stop,),
                                                    name="otel-ebpf-nvml-xid", daemon=True)
                self._xid_thread.start()
        self.ready.set()
        return True

    def _close(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=self.config.event_wait + 5)
            self._xid_thread = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)
            self._nv = None

    def scrape_once(self) -> int:
        """Scrape every GPU now and hand the records on; returns how many (scrape thread only)."""
        if self.scraper is None:
            return 0
        self._scope_pids.clear()
        records = self.scraper.scrape()
        self._send(records)
        return len(records)

    def _send(self, records: list[MetricRecord]) -> None:
        if not records:
            return
        self.ctx.telemetry.add("otel_ebpf.events.received", len(records), receiver=self.name)
        if getattr(self.next, "backpressure", False):
            self.next.consume(records, block_s=_BACKPRESSURE_S)  # type: ignore[call-arg]
        else:
            self.next.consume(records)

    def _want_pid(self, pid: int) -> bool:
        if self.config.processes == "all" or not self.ctx.target_pids:
            return True
        known = self._scope_pids.get(pid)
        if known is None:
            known = self._scope_pids[pid] = in_traced_tree(pid, self.ctx.target_pids, self.ctx.follow_children)
        return known

    def _on_xid(self, ev: XidError) -> None:
        """XID thread: one warning line and one hw.errors record per event."""
        attrs: dict[str, AttrValue] = dict(self._xid_attrs.get(ev.uuid) or {m.HW_ID: ev.uuid, "hw.type": "gpu"})
        where = ", ".join(str(attrs[k]) for k in ("hw.name", m.PCI_BUS_ID) if k in attrs)
        meaning = XID_MEANINGS.get(ev.xid, "see NVIDIA's XID catalog")
        log.warning("nvml: XID %d on GPU %s%s: %s", ev.xid, ev.uuid, f" ({where})" if where else "", meaning)
        attrs[m.ERROR_TYPE] = f"xid_{ev.xid}"
        kind, unit, description = m.METRICS["hw.errors"]
        self._send([MetricRecord(None, "hw.errors", kind, 1, attrs, unit=unit, description=description,
                                 scope=m.SCOPE)])

