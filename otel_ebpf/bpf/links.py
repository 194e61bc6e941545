"""Uprobes as BPF links (``BPF_TRACE_UPROBE_MULTI``, Linux 6.6+), so a receiver detaches in a fraction of a second.

BCC 0.26 attaches each uprobe as a perf event. Closing one unregisters it under the kernel's global ``event_mutex``
and waits out an RCU grace period there (kernel/trace/trace_event_perf.c ``perf_uprobe_destroy``,
kernel/events/uprobes.c ``uprobe_unregister_sync``), so the closes run one after another. Measured on this
project's VMs (kernel 6.18): 96 uprobes on libcudart, 10.3 s to close, 7.6 s even from 96 threads at once. A
uprobe_multi link is released outside that mutex (kernel/trace/bpf_trace.c ``bpf_uprobe_multi_link_release``),
so links closed from several threads share their grace periods: the same 96 in 0.21 s (5.2 s one after
another). Every receiver's shutdown, and so every stop of the agent and of the Python API's ``Session``, paid
the 10 s.

:class:`UprobeLinks` attaches one program to one symbol of one file as a link of one uprobe. The program is
loaded with ``expected_attach_type = BPF_TRACE_UPROBE_MULTI``; it runs on the same ``pt_regs`` as through a perf
event. Where the kernel has no such links (before 6.6, or one that answers ENOSYS/EOPNOTSUPP) they are off for
the process and :meth:`UprobeLinks.attach` returns False: the caller attaches through BCC as before. The symbol
is resolved by BCC (``BPF._check_path_symbol``: the file offset its own ``attach_uprobe`` uses), and its errors
are BCC's.

One more reason to prefer links: BCC 0.26's Python ``attach_uprobe`` calls libbcc's ``bpf_attach_uprobe`` with
six arguments of its seven, so the seventh, ``ref_ctr_offset``, is whatever the stack holds (0x6 measured: dmesg
"ref_ctr_offset mismatch ... ref_ctr_offset(old): 0x0 ref_ctr_offset(new): 0x6"). The kernel then bumps a
"semaphore" at that file offset of the library in every traced process, and refuses a uprobe at the same
function with another ``ref_ctr_offset``: a BCC uprobe and a correct one (a link here, bpftrace, libbpf tools)
on one function exclude each other, whichever came first. A link refused with EINVAL (that conflict, or a bad
offset) is attached through BCC instead, for that probe only.
"""
from __future__ import annotations

import ctypes as ct
import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from typing import Any

__all__ = ["UprobeLinks", "attach_one", "supported"]

log = logging.getLogger(__name__)

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_BPF_LINK_CREATE = 28  # include/uapi/linux/bpf.h enum bpf_cmd
_BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type (Linux 6.6)
_BPF_F_UPROBE_MULTI_RETURN = 1
_CLOSE_THREADS = 32
# errno of a kernel that lacks uprobe_multi links (EINVAL is also a conflict at one function: per probe, above)
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, 524}  # 524: ENOTSUPP (kernel-internal)


def _kernel_has_links(release: str) -> bool:
    """uprobe_multi links came in Linux 6.6 (``uname -r``: "6.18.0-...", "5.15.0-91-generic")."""
    try:
        major, minor = (int(x) for x in release.split("-", 1)[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 6)


_libc = ct.CDLL(None, use_errno=True)
_state = {"supported": _NR_BPF is not None and _kernel_has_links(os.uname().release)}


class _LinkCreate(ct.Structure):
    """``union bpf_attr``'s ``link_create`` with its ``uprobe_multi`` member (include/uapi/linux/bpf.h, 6.6)."""

    _fields_ = [("prog_fd", ct.c_uint32), ("target_fd", ct.c_uint32), ("attach_type", ct.c_uint32),
                ("flags", ct.c_uint32), ("path", ct.c_uint64), ("offsets", ct.c_uint64),
                ("ref_ctr_offsets", ct.c_uint64), ("cookies", ct.c_uint64), ("cnt", ct.c_uint32),
                ("multi_flags", ct.c_uint32), ("pid", ct.c_uint32), ("_pad", ct.c_uint32)]


def supported() -> bool:
    """Whether uprobes are still attached as links in this process (False after the kernel refused one)."""
    return _state["supported"]


def _link_create(prog_fd: int, path: bytes, offset: int, ret: bool, ref_ctr_offset: int = 0) -> int:
    """The link's fd, or -errno."""
    name = ct.create_string_buffer(path)
    offsets = (ct.c_uint64 * 1)(offset)
    ref_ctrs = (ct.c_uint64 * 1)(ref_ctr_offset)
    attr = _LinkCreate(prog_fd=prog_fd, attach_type=_BPF_TRACE_UPROBE_MULTI, path=ct.addressof(name),
                       offsets=ct.addressof(offsets), ref_ctr_offsets=ct.addressof(ref_ctrs) if ref_ctr_offset else 0,
                       cnt=1, multi_flags=_BPF_F_UPROBE_MULTI_RETURN if ret else 0)
    fd = _libc.syscall(_NR_BPF, _BPF_LINK_CREATE, ct.byref(attr), ct.sizeof(attr))
    return int(fd) if fd >= 0 else -ct.get_errno()


class UprobeLinks:
    """The uprobe links of one BCC program (``bpf``, a ``bcc.BPF``). Thread-safe."""

    def __init__(self, bpf: Any) -> None:
        self.bpf = bpf
        self._fds: dict[tuple[str, str, bool], list[int]] = {}  # (real path, symbol or @offset, ret) -> link fds
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(fds) for fds in self._fds.values())

    def attach(self, path: str, symbol: str, fn_name: str, ret: bool) -> bool:
        """Attach function ``fn_name`` to the entry (``ret``: the return) of ``symbol`` in ``path``. True: attached
        as a link. False: nothing was attached, and the function is not loaded, so BCC's ``attach_uprobe`` can load
        it as it does: links are off (the kernel has none), the kernel refused this one with EINVAL (a BCC uprobe on
        the same function: see the module's note), or the program did not load for a link (BCC's load then says
        why, if it fails too). Raises what BCC raises for a symbol it cannot resolve."""
        if not _state["supported"]:
            return False
        real, offset = type(self.bpf)._check_path_symbol(path.encode(), symbol.encode(), None, -1)
        return self._attach(real, offset, symbol, fn_name, ret, 0)

    def attach_at(self, path: str, offset: int, fn_name: str, ref_ctr_offset: int = 0, *, ret: bool = False) -> bool:
        """:meth:`attach` at file ``offset`` of ``path`` (a USDT site), bumping the semaphore at file offset
        ``ref_ctr_offset`` while attached (0: none), as bpf/refctr.py's perf events do."""
        if not _state["supported"]:
            return False
        return self._attach(os.fsencode(os.path.realpath(path)), offset, f"@{offset:#x}", fn_name, ret,
                            ref_ctr_offset)

    def _attach(self, real: bytes, offset: int, what: str, fn_name: str, ret: bool, ref_ctr_offset: int) -> bool:
        bcc = type(self.bpf)
        name = fn_name.encode()
        try:
            fn = self.bpf.load_func(name, bcc.KPROBE, attach_type=_BPF_TRACE_UPROBE_MULTI)
        except Exception:  # a kernel may refuse the attach type at load; BCC's own load says what else is wrong
            self._unload(name)
            return False
        fd = _link_create(fn.fd, real, offset, ret, ref_ctr_offset)
        path = os.path.realpath(os.fsdecode(real))
        if fd >= 0:
            with self._lock:
                self._fds.setdefault((path, what, ret), []).append(fd)
            return True
        # a function BCC loaded before (plain kprobe type) is refused too: unloaded, so BCC loads it again
        self._unload(name)
        if -fd == errno.EINVAL:  # another uprobe with another ref_ctr_offset there (BCC's), or a bad offset
            log.debug("uprobe link on %s:%s refused (%s): a perf-event uprobe instead", path, what, os.strerror(-fd))
            return False
        if -fd in _UNSUPPORTED:
            if _state["supported"]:
                log.info("uprobes attach as perf events (slow to detach): this kernel refused a uprobe_multi link "
                         "(%s)", os.strerror(-fd))
            _state["supported"] = False
            return False
        raise OSError(-fd, f"uprobe link on {path}:{what}: {os.strerror(-fd)}")

    def _unload(self, name: bytes) -> None:
        """Forget a function loaded for a link (BCC would reuse it, and a perf event refuses it). Links and perf
        events made with it keep the program; only this fd goes."""
        fn = self.bpf.funcs.pop(name, None)
        if fn is not None:
            os.close(fn.fd)

    def detach(self, path: str, symbol: str, ret: bool) -> bool:
        """Detach the links :meth:`attach` made at ``symbol`` of ``path``; False when it made none there."""
        with self._lock:
            fds = self._fds.pop((os.path.realpath(path), symbol, ret), [])
        for fd in fds:
            os.close(fd)
        return bool(fds)

    def close(self) -> None:
        """Detach every link, from several threads at once (their grace periods overlap). Safe twice."""
        with self._lock:
            fds = [fd for group in self._fds.values() for fd in group]
            self._fds = {}
        if not fds:
            return
        with ThreadPoolExecutor(min(_CLOSE_THREADS, len(fds)), thread_name_prefix="otel-ebpf-detach") as pool:
            for fd in fds:
                pool.submit(os.close, fd)


def attach_one(bpf: Any, path: str, symbol: str, fn_name: str, ret: bool = False) -> Callable[[], None]:
    """One uprobe the way the receivers attach theirs (a link, else BCC's), for a measurement or a check; returns
    what detaches it and cleans ``bpf`` up."""
    links = UprobeLinks(bpf)
    if not links.attach(path, symbol, fn_name, ret):
        (bpf.attach_uretprobe if ret else bpf.attach_uprobe)(name=path, sym=symbol, fn_name=fn_name)

    def undo() -> None:
        links.close()
        bpf.cleanup()
    return undo
