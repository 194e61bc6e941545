"""Uprobes with a reference counter (USDT semaphore), attached through perf_event_open.

BCC 0.26's Python ``attach_uprobe`` cannot pass ``ref_ctr_offset``, and its USDT class
enables a semaphore only for one PID (by writing /proc/PID/mem). The kernel (4.20+) does it
for every process that maps the file, now and later, when the uprobe is opened through the
``uprobe`` PMU with the semaphore's file offset in ``config[32:63]``
(``/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset``) - so an application's
``if probe.enabled:`` turns true the moment the agent attaches, and false when it detaches.

:class:`RefCtrUprobes` owns the perf event fds; ``close()`` detaches them all (idempotent).
:meth:`RefCtrUprobes.attach_function` attaches a BCC function as a uprobe_multi link instead where the kernel
has them (otel_ebpf.bpf.links: the same semaphore, and ~0.1 s less to detach each).
"""
from __future__ import annotations

import ctypes as ct
import fcntl
import os
import threading
from typing import Any

from otel_ebpf.bpf.links import UprobeLinks

__all__ = ["RefCtrUprobes"]

_NR_PERF_EVENT_OPEN = 298  # x86-64
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_SET_BPF = 0x40042408
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_PMU_DIR = "/sys/bus/event_source/devices/uprobe"
_PERF_ATTR_SIZE_VER5 = 112  # linux/perf_event.h (kernel 4.1+)


class _PerfEventAttr(ct.Structure):
    _fields_ = [("type", ct.c_uint32), ("size", ct.c_uint32), ("config", ct.c_uint64),
                ("sample_period", ct.c_uint64), ("sample_type", ct.c_uint64), ("read_format", ct.c_uint64),
                ("flags", ct.c_uint64), ("wakeup_events", ct.c_uint32), ("bp_type", ct.c_uint32),
                ("config1", ct.c_uint64), ("config2", ct.c_uint64), ("_rest", ct.c_uint8 * 64)]


def _pmu_type() -> int:
    with open(f"{_PMU_DIR}/type") as fh:
        return int(fh.read())


def _retprobe_bit() -> int:
    with open(f"{_PMU_DIR}/format/retprobe") as fh:  # "config:0"
        return int(fh.read().strip().split(":")[1])


class RefCtrUprobes:
    """Attached uprobes (system-wide, pid -1) that bump a USDT semaphore while attached.
    Thread-safe; ``close`` is idempotent."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._lock = threading.Lock()
        self._libc = ct.CDLL(None, use_errno=True)
        self._links: list[UprobeLinks] = []  # one per BCC program attached through attach_function

    def attach_function(self, bpf: Any, fn_name: str, path: str, offset: int, ref_ctr_offset: int = 0, *,
                        retprobe: bool = False) -> None:
        """BCC function ``fn_name`` of ``bpf`` at file ``offset`` of ``path``: a uprobe link where the kernel has
        them, else a perf event (:meth:`attach`)."""
        with self._lock:
            links = next((ul for ul in self._links if ul.bpf is bpf), None)
            if links is None:
                links = UprobeLinks(bpf)
                self._links.append(links)
        if links.attach_at(path, offset, fn_name, ref_ctr_offset, ret=retprobe):
            return
        fn = bpf.load_func(fn_name, type(bpf).KPROBE)
        self.attach(fn.fd, path, offset, ref_ctr_offset, retprobe=retprobe)

    def attach(self, prog_fd: int, path: str, offset: int, ref_ctr_offset: int = 0, *,
               retprobe: bool = False) -> None:
        """Run BPF program ``prog_fd`` (a BCC KPROBE-type function's fd) at file ``offset`` of
        ``path``; OSError names the file and offset when the kernel refuses."""
        attr = _PerfEventAttr()
        attr.type = _pmu_type()
        attr.size = _PERF_ATTR_SIZE_VER5  # the fields above plus zeros up to 112 bytes
        attr.config = (ref_ctr_offset << 32) | ((1 << _retprobe_bit()) if retprobe else 0)
        attr.sample_period = 1
        attr.wakeup_events = 1
        c_path = ct.create_string_buffer(os.fsencode(path))
        attr.config1 = ct.cast(c_path, ct.c_void_p).value or 0
        attr.config2 = offset
        fd = self._libc.syscall(_NR_PERF_EVENT_OPEN, ct.byref(attr), -1, 0, -1, _PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            err = ct.get_errno()
            raise OSError(err, f"perf_event_open(uprobe {path}:{offset:#x} ref_ctr {ref_ctr_offset:#x}): "
                               f"{os.strerror(err)}")
        try:
            fcntl.ioctl(fd, _PERF_EVENT_IOC_SET_BPF, prog_fd)
            fcntl.ioctl(fd, _PERF_EVENT_IOC_ENABLE, 0)
        except OSError:
            os.close(fd)
            raise
        with self._lock:
            self._fds.append(fd)

    def __len__(self) -> int:
        return len(self._fds) + sum(len(ul) for ul in self._links)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, []
            links, self._links = self._links, []
        for ul in links:
            ul.close()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
