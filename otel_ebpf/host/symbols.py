"""Function names of code addresses in live processes, from the mapped files' ELF symbol tables.

:class:`ElfFunctions` reads one ELF64 file's function symbols (``.symtab`` when the file has one, else
``.dynsym``) into three sorted arrays (start, size, name offset; about 20 bytes a function) and reads a name from
the memory-mapped string table only when asked: libtorch_cuda.so of torch 2.11 has 211k symbols and 66 MB of
names, of which a job launches a few hundred kernels. :class:`AddressSymbolizer` finds the mapping of an address
in ``/proc/PID/maps``, opens the file through ``/proc/PID/root`` (a container's own view), turns the address
into the file's link-time address with its ``PT_LOAD`` headers and looks it up. Parsed files are shared by every
process that maps them (keyed by device, inode and mtime) and bounded in number, as are the processes' maps.

:func:`short_function_name` turns an Itanium-mangled C++ name into its qualified name without template
arguments or parameters (``_ZN2at6native29vectorized_elementwise_kernelILi4E...`` ->
``at::native::vectorized_elementwise_kernel``): the bounded, readable kernel name dashboards group by.

Thread safety: an :class:`AddressSymbolizer` is used by one thread (a receiver's poll thread). Nothing here
raises for a bad file or a gone process: the answer is None.
"""
from __future__ import annotations

import bisect
import mmap
import os
import struct
from array import array
from collections import OrderedDict

from otel_ebpf.host.libraries import file_mappings

__all__ = ["AddressSymbolizer", "ElfFunctions", "load_segments", "short_function_name"]

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYM = struct.Struct("<IBBHQQ")
_SHT_SYMTAB, _SHT_DYNSYM, _PT_LOAD = 2, 11, 1
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_MAX_NAME = 4096  # bytes of one name read from the string table (mangled kernel names run to ~2 KB)


def load_segments(path: str) -> list[tuple[int, int, int, int]]:
    """(p_vaddr, p_offset, p_filesz, p_memsz) of each PT_LOAD segment of the 64-bit little-endian ELF file at
    ``path``. Raises OSError (unreadable) or ValueError (not such a file)."""
    with open(path, "rb") as fh:
        head = fh.read(_EHDR.size)
        if len(head) < _EHDR.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        (_, _, _, _, _, phoff, _, _, _, phentsize, phnum, _, _, _) = _EHDR.unpack(head)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    headers = (_PHDR.unpack_from(table, i * phentsize) for i in range(phnum))
    return [(p[3], p[2], p[5], p[6]) for p in headers if p[0] == _PT_LOAD]


class ElfFunctions:
    """The function symbols of one ELF64 little-endian file. Raises OSError/ValueError when it is not one."""

    def __init__(self, path: str) -> None:
        self._loads = load_segments(path)
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        m = self._map
        (_, _, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = _EHDR.unpack_from(m)
        sections = [_SHDR.unpack_from(m, shoff + i * shentsize) for i in range(shnum)]
        table = next((s for s in sections if s[1] == _SHT_SYMTAB), None) or \
            next((s for s in sections if s[1] == _SHT_DYNSYM), None)
        self.starts, self.sizes, self._names = array("Q"), array("Q"), array("I")  # st_name is 32 bits
        self._strtab = 0
        if table is None:
            return
        self._strtab = sections[table[6]][4]  # sh_link: the string table's section
        rows = sorted((value, size, name) for name, info, _, shndx, value, size in
                      _SYM.iter_unpack(m[table[4]:table[4] + table[5] - table[5] % _SYM.size])
                      if shndx != 0 and value and (info & 0xF) in (_STT_FUNC, _STT_GNU_IFUNC))
        for value, size, name in rows:
            if self.starts and self.starts[-1] == value:
                continue  # aliases: keep the first
            self.starts.append(value)
            self.sizes.append(size)
            self._names.append(name)

    def __len__(self) -> int:
        return len(self.starts)

    def vaddr_of_offset(self, offset: int) -> int | None:
        """The link-time address of file offset ``offset`` (its PT_LOAD segment), None outside every one."""
        for p_vaddr, p_offset, filesz, _ in self._loads:
            if p_offset <= offset < p_offset + filesz:
                return int(offset - p_offset + p_vaddr)
        return None

    def name_at(self, vaddr: int) -> str | None:
        """The function containing link-time address ``vaddr`` (a symbol of size 0 matches only its start)."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0 or not (vaddr == self.starts[i] or vaddr < self.starts[i] + self.sizes[i]):
            return None
        at = self._strtab + self._names[i]
        end = self._map.find(b"\0", at, at + _MAX_NAME)
        return self._map[at:end if end >= 0 else at + _MAX_NAME].decode(errors="replace")


class AddressSymbolizer:
    """Names code addresses of live processes. ``max_files`` parsed files and ``max_processes`` processes'
    maps are kept (least recently used go first); not thread-safe."""

    def __init__(self, max_files: int = 16, max_processes: int = 256) -> None:
        self._files: OrderedDict[tuple[int, int, int], ElfFunctions | None] = OrderedDict()
        self._maps: OrderedDict[int, list[tuple[int, int, int, str]]] = OrderedDict()
        self._max_files, self._max_processes = max_files, max_processes

    def remember(self, pid: int) -> None:
        """Read ``pid``'s mappings now, while it lives: its addresses can then be named after it exits."""
        self._mapping(pid, -1, refresh=True)

    def forget(self, pid: int) -> None:
        """Drop ``pid``'s maps (its process is gone)."""
        self._maps.pop(pid, None)

    def name(self, pid: int, addr: int) -> str | None:
        """The (mangled) name of the function of ``pid`` containing ``addr``; None when unknown."""
        found = self._mapping(pid, addr, refresh=False) or self._mapping(pid, addr, refresh=True)
        if found is None:
            return None
        start, offset, path = found
        elf = self._elf(pid, path)
        if elf is None:
            return None
        vaddr = elf.vaddr_of_offset(addr - start + offset)
        return None if vaddr is None else elf.name_at(vaddr)

    def _mapping(self, pid: int, addr: int, refresh: bool) -> tuple[int, int, str] | None:
        maps = None if refresh else self._maps.get(pid)
        if maps is None:
            maps = file_mappings(pid)
            if maps is None:
                return None
            self._maps[pid] = maps
            while len(self._maps) > self._max_processes:
                self._maps.popitem(last=False)
        self._maps.move_to_end(pid)
        for start, end, offset, path in maps:
            if start <= addr < end:
                return start, offset, path
        return None

    def _elf(self, pid: int, path: str) -> ElfFunctions | None:
        """The parsed file at ``path`` as ``pid`` sees it (through /proc/PID/root while it lives, else the
        agent's own view). Only a file that is no ELF is remembered as None: one that could not be opened
        (the process exited between the stat and the open, and /proc/PID/root went with it: seen in CI as
        unnamed kernels) is tried again, through the next view and on the next call."""
        for candidate in (f"/proc/{pid}/root{path}", path):
            try:
                st = os.stat(candidate)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino, st.st_mtime_ns)
            if key not in self._files:
                try:
                    elf: ElfFunctions | None = ElfFunctions(candidate)
                except OSError:
                    continue
                except (ValueError, struct.error):
                    elf = None
                self._files[key] = elf
                while len(self._files) > self._max_files:
                    self._files.popitem(last=False)
            self._files.move_to_end(key)
            return self._files[key]
        return None


_SUBSTITUTES = {"St": "std", "Sa": "std::allocator", "Sb": "std::basic_string", "Ss": "std::string"}


def short_function_name(name: str) -> str:
    """``name`` without template arguments, parameters or return type, for an Itanium-mangled name (the
    qualified name: ``at::native::(anonymous namespace)::foo``); any other name as it is. A mangled name this
    cannot read comes back as it is, cut at 128 characters."""
    if name.startswith("_Z") and "__device_stub__Z" in name[:24]:  # nvcc's host stub of a kernel
        name = "_" + name[name.index("__device_stub__Z") + 15:]
    if not name.startswith("_Z"):
        return name
    parts = _nested_name(name, 3) if name.startswith("_ZN") else _source_names(name, 2, 1)
    return "::".join(parts) if parts else name[:128]


def _nested_name(s: str, i: int) -> list[str]:
    while i < len(s) and s[i] in "rVKRO":  # CV- and ref-qualifiers of a member function
        i += 1
    parts: list[str] = []
    if s[i:i + 2] in _SUBSTITUTES:
        parts.append(_SUBSTITUTES[s[i:i + 2]])
        i += 2
    return parts + _source_names(s, i, 64)


def _source_names(s: str, i: int, most: int) -> list[str]:
    """Up to ``most`` <source-name>s (<length><identifier>) from ``s[i:]``, stopping at anything else."""
    parts: list[str] = []
    while len(parts) < most and i < len(s):
        if s[i] == "L" and s[i + 1:i + 2].isdigit():
            i += 1  # internal linkage (a static function)
        if not s[i].isdigit():
            break
        j = i
        while j < len(s) and s[j].isdigit():
            j += 1
        n = int(s[i:j])
        ident = s[j:j + n]
        if len(ident) != n:
            return []
        parts.append("(anonymous namespace)" if ident.startswith("_GLOBAL__N") else ident)
        i = j + n
    return parts
