"""GPU identity: the physical GPU (``hw.id``) behind a process's CUDA device ordinal.

``hw.id`` is the UUID exactly as ``nvmlDeviceGetUUID`` and dcgm-exporter's ``UUID`` label write
it (``GPU-...``; a MIG instance is ``MIG-...``), so CUDA and NCCL spans join dcgm-exporter's and
the nvml receiver's per-GPU series.

A CUDA ordinal is an index into the devices the CUDA runtime of *that process* enumerates.
:meth:`GpuResolver.hw_id` maps (pid, ordinal) to a UUID, first source that answers:

1. The process's environment (``/proc/PID/environ``, the initial environment, read through
   :class:`otel_ebpf.host.processes.ResourceCache`):

   * ``NVIDIA_VISIBLE_DEVICES`` (only for a process in a container: on the host it means
     nothing): the GPUs the NVIDIA container runtime mounted, as NVML indices or UUIDs;
     ``all``, or ``none`` / ``void`` / empty (no GPU). A MIG UUID there (the device plugin's
     ``nvidia.com/mig-*`` resources) makes that MIG device an ordinal of its own. Any other value (the device plugin's
     ``/var/run/nvidia-container-devices`` volume strategy) leaves the set unknown.
   * ``CUDA_VISIBLE_DEVICES`` picks from those GPUs; its order is the ordinal order. Entries:
     integers (positions in the enumeration order), ``GPU-<uuid>`` or a unique prefix of one,
     ``MIG-<uuid>``. As in CUDA, the list ends at the first entry that is not valid (``-1``,
     empty, unknown or ambiguous UUID prefix, index out of range, a repeated entry): the
     entries before it stay visible. Unset: every GPU; set but empty: none.
   * Enumeration order: CUDA's default ``CUDA_DEVICE_ORDER=FASTEST_FIRST`` ranks GPUs by speed,
     ties broken by PCI bus id; ``PCI_BUS_ID`` is PCI order. NVML gives us the PCI bus ids, not
     CUDA's speed ranking, so: with ``PCI_BUS_ID``, or when every candidate GPU has the same model
     name (the usual ML node; FASTEST_FIRST then *is* PCI order), ordinals follow PCI bus id order.
     FASTEST_FIRST over GPUs of different models: integer entries and bare ordinals are left
     unresolved (``otel_ebpf.gpus.unresolved{reason=fastest_first}``); UUID entries still resolve.

2. NVML's process list (``nvmlDeviceGetComputeRunningProcesses``, refreshed at most every
   ``process_refresh_s``): a process with a CUDA context on exactly one GPU is on that GPU. This
   fills in when the environment is missing or unusable (the process exited, or it set
   ``CUDA_VISIBLE_DEVICES`` at run time, which ``/proc/PID/environ`` does not show), and it
   overrides a physical-GPU answer from the environment that disagrees (counted in
   ``otel_ebpf.gpus.mismatch``).

Ordinal ``-1`` (no successful ``cudaSetDevice`` seen on the thread) resolves only when it is
unambiguous: one visible GPU, or NVML lists the process on exactly one GPU.

Without NVML (no driver, no nvidia-ml-py) there is no UUID table: one INFO line, and every lookup
answers None (signals keep ``cuda.device.index``). NVML is loaded lazily at the first lookup
(``nvmlInit``: milliseconds, up to seconds on a GPU without persistence mode; once).

Threading: :class:`GpuResolver` is shared by the processors of every pipeline (one worker thread
each): one lock guards its state; NVML calls run under it (rare: table load, rate-limited
process list). Answers are cached per (pid, ordinal) in a bounded LRU (positive answers for
``ttl_s``, negative ones for ``negative_ttl_s``); :meth:`GpuResolver.forget` drops a pid.
Lookups never raise.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from otel_ebpf.core.telemetry import Telemetry

__all__ = [
    "GpuInfo", "GpuResolver", "GpuSource", "NvmlSource", "VisibleDevices", "attach", "ordinal_uuids",
    "parse_visible_devices",
]

log = logging.getLogger(__name__)

UNRESOLVED = "otel_ebpf.gpus.unresolved"
MISMATCH = "otel_ebpf.gpus.mismatch"
_INDEX = re.compile(r"^[0-9]{1,6}$")
_GPU_PREFIX = re.compile(r"^GPU-[0-9a-fA-F][0-9a-fA-F-]*$")
_MIG = re.compile(r"^MIG-[0-9A-Za-z][0-9A-Za-z/-]*$")


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML enumerates it. ``migs``: UUIDs of its MIG devices."""

    uuid: str
    index: int
    bus_id: str = ""
    model: str = ""
    migs: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisibleDevices:
    """A parsed ``CUDA_VISIBLE_DEVICES``: the valid ``entries`` in order and, when the list
    was cut short, the first ``invalid`` entry (CUDA ignores it and everything after it)."""

    entries: tuple[str, ...]
    invalid: str | None = None


def parse_visible_devices(text: str) -> VisibleDevices:
    """Split ``CUDA_VISIBLE_DEVICES`` text; syntax only (index ranges and UUID prefixes are
    checked against the GPUs by :func:`ordinal_uuids`). ``""`` is the empty list."""
    if not text.strip():
        return VisibleDevices(())
    entries: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        valid = bool(_INDEX.match(item) or _GPU_PREFIX.match(item) or _MIG.match(item))
        if _INDEX.match(item):
            item = str(int(item))
        if not valid or item in entries:
            return VisibleDevices(tuple(entries), raw.strip())
        entries.append(item)
    return VisibleDevices(tuple(entries))


def _pci_order(gpus: Sequence[GpuInfo]) -> list[GpuInfo]:
    return sorted(gpus, key=lambda g: (g.bus_id.lower() or "~", g.index))


def _match(entry: str, gpus: Sequence[GpuInfo], by_position: bool) -> str | None:
    """The UUID ``entry`` names among ``gpus`` (in enumeration order), or None (invalid)."""
    if _INDEX.match(entry):
        i = int(entry)
        if by_position:
            return gpus[i].uuid if i < len(gpus) else None
        return next((g.uuid for g in gpus if g.index == i), None)
    if entry.startswith("MIG-"):
        for g in gpus:
            if entry in g.migs:
                return entry
        return entry if re.match(r"^MIG-[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", entry) else None
    hits = [g.uuid for g in gpus if g.uuid.lower().startswith(entry.lower())]
    return hits[0] if len(hits) == 1 else None


def _container_gpus(gpus: list[GpuInfo], value: str) -> list[GpuInfo] | None:
    """Devices an ``NVIDIA_VISIBLE_DEVICES`` value mounts, in PCI order; a MIG device stands for
    itself (its UUID, its GPU's bus id). None when the value does not say (a path, an unknown id)."""
    value = value.strip()
    if value == "all":
        return gpus
    if value in ("", "none", "void"):
        return []
    chosen: dict[str, GpuInfo] = {}
    for item in (v.strip() for v in value.split(",")):
        if not (_INDEX.match(item) or _GPU_PREFIX.match(item) or _MIG.match(item)):
            return None  # e.g. the device plugin's volume-mounts strategy: a path
        uuid = _match(item, gpus, by_position=False)
        parent = next((g for g in gpus if uuid == g.uuid or uuid in g.migs), None)
        if uuid is None or parent is None:
            return None
        chosen[uuid] = parent if uuid == parent.uuid else GpuInfo(uuid, parent.index, parent.bus_id, parent.model)
    return _pci_order(list(chosen.values()))


def ordinal_uuids(gpus: Sequence[GpuInfo], env: Mapping[str, str], *,
                  in_container: bool = False) -> tuple[list[str] | None, str]:
    """(``hw.id`` of every CUDA ordinal in order, "") or (None, why the order is unknown).

    ``env`` holds the process's CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER /
    NVIDIA_VISIBLE_DEVICES (missing keys: unset). See the module docstring for the rules.
    """
    candidates = _pci_order(gpus)
    if in_container and "NVIDIA_VISIBLE_DEVICES" in env:
        mounted = _container_gpus(candidates, env["NVIDIA_VISIBLE_DEVICES"])
        if mounted is None:
            return None, "nvidia_visible_devices"
        candidates = mounted
    pci = env.get("CUDA_DEVICE_ORDER", "").strip() == "PCI_BUS_ID" or len({g.model for g in candidates}) <= 1
    if "CUDA_VISIBLE_DEVICES" not in env:
        return ([g.uuid for g in candidates], "") if pci else (None, "fastest_first")
    out: list[str] = []
    for entry in parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]).entries:
        if _INDEX.match(entry) and not pci:
            return None, "fastest_first"
        uuid = _match(entry, candidates, by_position=True)
        if uuid is None or uuid in out:
            break  # CUDA stops at the first invalid entry
        out.append(uuid)
    return out, ""


class GpuSource(Protocol):
    """Where the GPU table and NVML's process list come from (NVML; a table in tests)."""

    def open(self) -> str:
        """Load; "" when ready, else one sentence saying why not."""

    def gpus(self) -> list[GpuInfo]: ...

    def processes(self) -> dict[int, frozenset[str]]:
        """{host pid: UUIDs of the GPUs it has a compute context on}."""

    def close(self) -> None: ...


class NvmlSource:
    """:class:`GpuSource` through pynvml (nvidia-ml-py). ``library``: a libnvidia-ml.so.1 to
    load instead of the loader's (``receivers.nvml.library``). Failed calls are skipped."""

    def __init__(self, library: str = "") -> None:
        self.library = library
        self._nv: Any = None
        self._handles: list[tuple[str, Any]] = []

    def open(self) -> str:
        from otel_ebpf.host.nvml import load  # the nvml receiver uses the same loader: one set of messages

        nv, why = load(self.library)
        self._nv = nv
        return why

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, name)(*args)
        except Exception:  # NVMLError, a missing binding: this piece is unknown
            return None

    def gpus(self) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        self._handles = []
        for index in range(self._call("nvmlDeviceGetCount") or 0):
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            uuid = handle is not None and self._call("nvmlDeviceGetUUID", handle)
            if not uuid:
                continue
            pci = self._call("nvmlDeviceGetPciInfo_v3", handle)
            bus = getattr(pci, "busId", b"") or b""
            out.append(GpuInfo(str(uuid), index, bus.decode(errors="replace") if isinstance(bus, bytes) else str(bus),
                               str(self._call("nvmlDeviceGetName", handle) or ""), self._migs(handle)))
            self._handles.append((str(uuid), handle))
        return out

    def _migs(self, handle: Any) -> tuple[str, ...]:
        mode = self._call("nvmlDeviceGetMigMode", handle)
        if not mode or not mode[0]:
            return ()
        migs = []
        for i in range(self._call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            uuid = mig is not None and self._call("nvmlDeviceGetUUID", mig)
            if uuid:
                migs.append(str(uuid))
        return tuple(migs)

    def processes(self) -> dict[int, frozenset[str]]:
        found: dict[int, set[str]] = {}
        for uuid, handle in self._handles:
            for p in self._call("nvmlDeviceGetComputeRunningProcesses", handle) or ():
                found.setdefault(int(p.pid), set()).add(uuid)
        return {pid: frozenset(u) for pid, u in found.items()}

    def close(self) -> None:
        if self._nv is not None:
            self._call("nvmlShutdown")
            self._nv = None


EnvOf = Callable[[int], "tuple[Mapping[str, str], bool] | None"]


class GpuResolver:
    """(pid, CUDA ordinal) -> ``hw.id`` (see the module docstring). ``env_of(pid)`` returns the
    process's environment subset and whether it runs in a container, or None when unreadable."""

    def __init__(self, source: GpuSource, env_of: EnvOf, telemetry: Telemetry | None = None, *,
                 max_entries: int = 4096, ttl_s: float = 30.0, negative_ttl_s: float = 5.0,
                 process_refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._env_of = env_of
        self._telemetry = telemetry or Telemetry()
        self._max, self._ttl, self._neg_ttl = max(1, max_entries), ttl_s, negative_ttl_s
        self._refresh = process_refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "new"  # new -> ready | unavailable -> closed
        self._table: list[GpuInfo] = []
        self._procs: dict[int, frozenset[str]] = {}
        self._procs_at = float("-inf")
        self._cache: OrderedDict[tuple[int, int], tuple[str | None, float]] = OrderedDict()
        self._ordinals: dict[int, set[int]] = {}  # pid -> ordinals in _cache: forget() without a scan

    @property
    def gpus(self) -> list[GpuInfo]:
        """The GPU table (empty until loaded, and without NVML)."""
        return list(self._table)

    def hw_id(self, pid: int, ordinal: int) -> str | None:
        """The UUID of ``pid``'s CUDA device ``ordinal`` (-1: the thread's device is unknown), or
        None when it cannot be known. Never raises."""
        key = (pid, ordinal)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[1] > now:
                self._cache.move_to_end(key)
                return hit[0]
            try:
                uuid = self._resolve(pid, ordinal, now)
            except Exception:  # a lookup must never break the pipeline
                log.debug("gpu identity of pid %d ordinal %d failed", pid, ordinal, exc_info=True)
                uuid = None
            self._cache[key] = (uuid, now + (self._ttl if uuid else self._neg_ttl))
            self._cache.move_to_end(key)
            self._ordinals.setdefault(pid, set()).add(ordinal)
            while len(self._cache) > self._max:
                (old_pid, old_ordinal), _ = self._cache.popitem(last=False)
                self._unindex(old_pid, old_ordinal)
        return uuid

    def forget(self, pid: int) -> None:
        """Drop the answers for ``pid`` (its process exited)."""
        with self._lock:
            for ordinal in self._ordinals.pop(pid, ()):
                self._cache.pop((pid, ordinal), None)

    def _unindex(self, pid: int, ordinal: int) -> None:
        ordinals = self._ordinals.get(pid)
        if ordinals is not None:
            ordinals.discard(ordinal)
            if not ordinals:
                del self._ordinals[pid]

    def close(self) -> None:
        """Release NVML; later lookups answer None. Safe twice and before any lookup."""
        with self._lock:
            if self._state == "ready":
                self.source.close()
            self._state = "closed"
            self._cache.clear()
            self._ordinals.clear()

    # ---- under the lock -----------------------------------------------------------------
    def _load(self) -> bool:
        if self._state == "new":
            why = self.source.open()
            self._table = self.source.gpus() if not why else []
            if why or not self._table:
                # INFO, not WARNING: on a GPU-less host the nvml receiver already warned about the same cause.
                log.info("GPU identity: no hw.id on CUDA/NCCL signals (cuda.device.index is kept): %s",
                         why or "NVML lists no GPU")
                if not why:
                    self.source.close()
                self._state = "unavailable"
            else:
                self._state = "ready"
                log.info("GPU identity: %d GPU(s) from NVML", len(self._table))
        return self._state == "ready"

    def _nvml_gpus(self, pid: int, now: float) -> frozenset[str]:
        if now - self._procs_at >= self._refresh:
            self._procs_at = now
            self._procs = self.source.processes()
        return self._procs.get(pid, frozenset())

    def _resolve(self, pid: int, ordinal: int, now: float) -> str | None:
        if not self._load():
            return None
        found = self._env_of(pid)
        ids, why = (None, "environ_unreadable") if found is None else ordinal_uuids(
            self._table, found[0], in_container=found[1])
        candidate = None
        if ids is not None and 0 <= ordinal < len(ids):
            candidate = ids[ordinal]
        elif ids is not None and ordinal < 0 and len(ids) == 1:
            candidate = ids[0]
        on = self._nvml_gpus(pid, now)
        if len(on) == 1:
            (only,) = on
            if candidate is not None and candidate != only and not candidate.startswith("MIG-"):
                self._telemetry.add(MISMATCH, 1)
                log.debug("pid %d: environment says %s for ordinal %d, NVML lists it on %s only",
                          pid, candidate, ordinal, only)
                return only
            return candidate or only
        if candidate is None:
            reason = why or ("unknown_device" if ordinal < 0 else "ordinal_not_visible")
            self._telemetry.add(UNRESOLVED, 1, reason=reason)
        return candidate


def attach(ctx: Any, library: str = "") -> GpuResolver:
    """The :class:`GpuResolver` shared through ``ctx.gpus`` (a pipeline Context), created on the
    first call over NVML with environments from ``ctx.resources``. ``library`` (non-empty) sets
    the libnvidia-ml.so.1 to load, if NVML is not loaded yet."""
    resolver = getattr(ctx, "gpus", None)
    if resolver is None:
        from otel_ebpf.host.processes import ResourceCache, process_environment

        cache = getattr(ctx, "resources", None)

        def env_of(pid: int) -> tuple[Mapping[str, str], bool] | None:
            if isinstance(cache, ResourceCache):
                return cache.environment(pid)
            return process_environment(pid)

        resolver = ctx.gpus = GpuResolver(NvmlSource(library), env_of, ctx.telemetry)
    if library and isinstance(resolver.source, NvmlSource) and resolver._state == "new":
        resolver.source.library = library
    return resolver
