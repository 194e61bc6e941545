"""Names of launched kernels: the launch's ``func`` -> a short kernel name (``at::native::elementwise_kernel``).

What ``func`` is depends on who launched (cuda.bpf.c, ``kernel_return``):

* CUDA 12 ``<<<>>>`` (``cudaLaunchKernel``): the kernel's host function, an address in the program or library
  that holds the kernel; named from that file's ELF symbol table (``otel_ebpf.host.symbols``).
* CUDA 13 ``<<<>>>``: a ``cudaKernel_t`` handle from ``__cudaGetKernel(&handle, hostFun)``, and
  ``cudaGetFuncBySymbol(&f, hostFun)``'s ``cudaFunction_t``: the handle's record gives the host function, named
  as above, at once (the process is alive then).
* the driver (``cuLaunchKernel*``: Triton, cuBLAS's static runtime): a ``CUfunction`` from
  ``cuModuleGetFunction(&f, module, name)`` (or a ``CUkernel`` from ``cuLibraryGetKernel``): the record carries
  the name.

A func no record explains is tried as a host function. Unknown stays ``""``. Bounded: ``max_entries`` (pid,
handle) pairs, least recently used first out, each one evicted counted by the owner (``evicted``). Used from the
receiver's poll thread only.
"""
from __future__ import annotations

from collections import OrderedDict

from otel_ebpf.host.symbols import AddressSymbolizer, short_function_name

__all__ = ["KernelNames"]

_MAX_PROCESSES = 4096  # processes remembered as seen (one read each of their maps; a forgotten one is read again)


class KernelNames:
    """(pid, func) -> short kernel name, learned from handle records and symbol tables."""

    def __init__(self, max_entries: int = 65536, symbolizer: AddressSymbolizer | None = None) -> None:
        self._names: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._max = max_entries
        self._symbols = symbolizer or AddressSymbolizer()
        self._pids: OrderedDict[int, None] = OrderedDict()  # processes whose mappings were read (bounded)
        self._held: dict[int, int] = {}  # pid -> its entries in _names: most exits and execs have none to forget
        self.evicted = 0  # entries pushed out by the bound (a later launch of theirs may go unnamed)

    def seen(self, pid: int, refresh: bool = False) -> None:
        """Note a live process: its mappings are read now (again after an exec: ``refresh``), so its host
        functions can still be named after it exits (its last launch counts are read after that)."""
        if refresh:
            self.forget(pid)
        if pid not in self._pids:
            self._pids[pid] = None
            if len(self._pids) > _MAX_PROCESSES:
                self._pids.popitem(last=False)
            self._symbols.remember(pid)

    def learn(self, pid: int, handle: int, host_fun: int, name: str) -> None:
        """A kernel handle was made: it stands for ``host_fun`` (runtime) or is named ``name`` (driver)."""
        if not handle:
            return
        if not name and host_fun:
            mangled = self._symbols.name(pid, host_fun)
            name = short_function_name(mangled) if mangled else ""
        elif name:
            name = short_function_name(name)
        self._put((pid, handle), name)

    def name(self, pid: int, func: int) -> str:
        """The short name of the kernel launched as ``func`` by ``pid``; "" when unknown."""
        key = (pid, func)
        found = self._names.get(key)
        if found is not None:
            self._names.move_to_end(key)
            return found
        mangled = self._symbols.name(pid, func) if func else None
        name = short_function_name(mangled) if mangled else ""
        self._put(key, name)
        return name

    def forget(self, pid: int) -> None:
        """``pid`` is gone: drop its handles and mappings (a new process may reuse the number)."""
        self._pids.pop(pid, None)
        self._symbols.forget(pid)
        if self._held.pop(pid, 0):
            for key in [k for k in self._names if k[0] == pid]:
                del self._names[key]

    def _put(self, key: tuple[int, int], name: str) -> None:
        if key not in self._names:
            self._held[key[0]] = self._held.get(key[0], 0) + 1
        self._names[key] = name
        self._names.move_to_end(key)
        while len(self._names) > self._max:
            (pid, _), _ = self._names.popitem(last=False)
            self.evicted += 1
            left = self._held[pid] - 1
            if left:
                self._held[pid] = left
            else:
                del self._held[pid]
