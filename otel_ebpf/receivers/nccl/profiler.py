"""The NCCL receiver's side of otel-ebpf's NCCL profiler plugin (otel_ebpf/nccl_profiler, docs/nccl-profiler.md).

A process that loaded ``libnccl-profiler-otel_ebpf.so`` (NCCL_PROFILER_PLUGIN) fires the USDT probes of
``probes.h``. :class:`PluginProbes` reads every location of the probes the receiver uses from the plugin's ELF
notes, generates one BPF function per distinct argument layout that reads the arguments and calls the handler
of ``nccl_prof.bpf.c``, and attaches each location as a uprobe with the probe's semaphore as reference counter
(otel_ebpf/bpf/refctr.py): while the agent runs, the plugin in every process that maps that file sees the
semaphores raised and asks NCCL for its events; when the agent stops they drop back and NCCL stops calling.

The functions are compiled with the program, so the argument layouts must be known at start: those of the
agent's own plugin (always) and of any copy named in ``libraries`` or mapped by a traced process then. A copy
opened later with a layout no compiled function reads is not attached (a warning, ``otel_ebpf.probes.failed``).

``group_start`` and ``event_stop`` are not attached: the receiver needs no group events (the uprobes give the
application's groups) and no stops (a kernel channel's stop state is its last event used), and an unattached
probe's semaphore stays 0, so the plugin does not fire it: per collective that saves 5-6 uprobe hits (~750 ns
each on this VM), leaving api_start, coll_start and 2 per kernel channel.

The records' layouts are the receiver's (``PROF_*`` in receiver.py, checked against nccl.h); their ``rec`` parts
are the structs of probes.h mirrored here. Not thread-safe by itself: the receiver calls
:meth:`PluginProbes.attach` under its attach lock.
"""
from __future__ import annotations

import os
import struct
from typing import Any

from otel_ebpf.bpf.refctr import RefCtrUprobes
from otel_ebpf.bpf.usdt import ArgLoc, Site, UsdtError, arg_reader, find_site
from otel_ebpf.nccl_profiler import PROVIDER

__all__ = ["COLL_REC", "COMM_REC", "HANDLERS", "P2P_REC", "PluginProbes", "VariantError", "is_plugin", "text"]

PLUGIN_PREFIX = "libnccl-profiler-"
# probe -> (handler in nccl_prof.bpf.c, number of arguments)
HANDLERS: dict[str, tuple[str, int]] = {
    "comm_init": ("nprof_comm_init", 2), "comm_finalize": ("nprof_comm_finalize", 1),
    "api_start": ("nprof_api_start", 2), "coll_start": ("nprof_coll_start", 2), "p2p_start": ("nprof_p2p_start", 2),
    "kernel_ch_start": ("nprof_kernel_ch_start", 4), "kernel_ch_stop": ("nprof_kernel_ch_stop", 2),
}

_FUNC = """
int nprof_{k}(struct pt_regs *ctx)
{{
{reads}
    return {handler}({args});
}}
"""


class VariantError(UsdtError):
    """Our plugin's probes, but laid out as no compiled reader reads them (a copy built differently)."""


def is_plugin(path: str) -> bool:
    """Whether ``path`` names an NCCL profiler plugin (NCCL's libnccl-profiler-NAME.so naming)."""
    return os.path.basename(path).startswith(PLUGIN_PREFIX)


class PluginProbes:
    """The plugin probes of one receiver: generated functions, attached locations, semaphores held."""

    def __init__(self) -> None:
        self._refctr = RefCtrUprobes()
        self._variants: dict[tuple[str, tuple[ArgLoc, ...]], int] = {}
        self._sites: dict[str, dict[str, list[Site]]] = {}

    def learn(self, path: str) -> None:
        """Read ``path``'s probe locations so that the program compiles a reader for each layout (before
        start). Raises UsdtError when it is not our plugin (no otel_ebpf_nccl probes)."""
        for probe, sites in self._sites_of(path).items():
            for site in sites:
                self._variants.setdefault((probe, site.args), len(self._variants))

    def source(self) -> str:
        """The generated functions, one per (probe, argument layout) learnt."""
        parts = []
        for (probe, args), k in self._variants.items():
            handler, nargs = HANDLERS[probe]
            site = Site("", 0, 0, args)
            reads = "\n".join(f"    u64 t{i} = 0;\n    {arg_reader(site, i, f't{i}')}" for i in range(nargs))
            parts.append(_FUNC.format(k=k, reads=reads, handler=handler,
                                      args=", ".join(f"t{i}" for i in range(nargs))))
        return "\n".join(parts)

    def attach(self, bpf: Any, path: str) -> int:
        """Attach every location of the receiver's probes in ``path``; returns how many. Raises UsdtError
        (not our plugin, or a layout no compiled function reads) or OSError (the kernel refused)."""
        n = 0
        for probe, sites in self._sites_of(path).items():
            for site in sites:
                k = self._variants.get((probe, site.args))
                if k is None:
                    raise VariantError(f"{path}: {PROVIDER}:{probe} operands differ from every compiled variant "
                                       "(a plugin built differently); restart the agent to include it")
                self._refctr.attach_function(bpf, f"nprof_{k}", path, site.offset, site.semaphore_offset)
                n += 1
        return n

    def close(self) -> None:
        """Detach everything: the semaphores drop back to 0 in every process (idempotent)."""
        self._refctr.close()

    def _sites_of(self, path: str) -> dict[str, list[Site]]:
        real = os.path.realpath(path)
        if real not in self._sites:
            self._sites[real] = {probe: find_site(path, PROVIDER, probe) for probe in HANDLERS}
        return self._sites[real]


# ---- the rec structs of probes.h, as the records of nccl.h (nccl_prof_comm/coll/p2p.rec) carry them ------------
_STR = 24  # OE_NCCL_STR
COMM_REC = struct.Struct("<QiiiI64s")  # oe_nccl_comm_rec
COLL_REC = struct.Struct(f"<QQQQQQiBB2x{_STR}s{_STR}s{_STR}s{_STR}sQ")  # oe_nccl_coll_rec
P2P_REC = struct.Struct(f"<QQQQiB3x{_STR}s{_STR}sQ")  # oe_nccl_p2p_rec


def text(raw: bytes) -> str:
    """A NUL-terminated string of a rec."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")
