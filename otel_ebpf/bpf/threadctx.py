"""The per-thread "current call" map shared by the cuda, python and torch BPF programs of one
agent (``oe_thread_ctx`` in otel_ebpf/bpf/include/common.bpf.c), and the operator names behind it.

BCC compiles every receiver's program separately; they share the map through a pin on bpffs:
``/sys/fs/bpf/otel-ebpf-<agent pid>/thread_ctx_<context>``. The first program that loads
creates and pins it (BCC's ``BPF_TABLE_PINNED``), the others open the pin. :func:`acquire`
mounts bpffs when ``/sys/fs/bpf`` is not one, removes the pins of agents that are gone (a
SIGKILLed agent cannot remove its own), and counts users; :func:`release` removes the pin when
the last program of that context lets go (the map itself lives while a program holds it).

``<context>`` tells apart two agents (``Context`` objects) in one process (tests, the Python
API), so their programs never share a map.

Operator names: a torch program writes the entry address of the operator a thread is in; the
torch receiver registers its address -> name lookup here (:func:`register_ops`) so the cuda
receiver can name the operator of its launch counters (:func:`op_name`).

Thread-safe (one lock); never raises out of :func:`acquire` / :func:`release` / :func:`op_name`.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["BPFFS", "acquire", "ensure_bpffs", "op_name", "pin_path", "register_ops", "release", "unpin",
           "unregister_ops"]

log = logging.getLogger(__name__)
BPFFS = Path("/sys/fs/bpf")
_PREFIX = "otel-ebpf-"
_lock = threading.Lock()
_refs: dict[str, int] = {}
_ops: dict[int, Callable[[int, int], str | None]] = {}  # id(ctx) -> (pid, address) -> operator
_warned = False


def pin_path(ctx: object) -> Path:
    """Where ``ctx``'s map is pinned (the same for every program of that context)."""
    return BPFFS / f"{_PREFIX}{os.getpid()}" / f"thread_ctx_{id(ctx):x}"


def _is_bpffs(path: Path) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            return any(line.split()[1:3] == [str(path), "bpf"] for line in fh if len(line.split()) > 2)
    except OSError:
        return False


def ensure_bpffs() -> None:
    """Mount bpffs on /sys/fs/bpf unless it is one already; raises OSError naming the fault.
    Callers serialize (each holds its own module lock around it and the pin that follows)."""
    if not _is_bpffs(BPFFS):
        _mount_bpffs()


def _mount_bpffs() -> None:
    """``mount -t bpf bpf /sys/fs/bpf`` (needs CAP_SYS_ADMIN); raises OSError naming the fault."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.mount(b"bpf", str(BPFFS).encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t bpf bpf {BPFFS}: {os.strerror(err)}")
    log.info("mounted bpffs on %s (for the map the cuda/python/torch programs share)", BPFFS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dir(d: Path) -> None:
    for f in d.iterdir():
        with contextlib.suppress(OSError):
            f.unlink()
    with contextlib.suppress(OSError):
        d.rmdir()


def _clean_stale() -> None:
    """Remove the pin folders of agents that died without removing them (SIGKILL)."""
    for d in BPFFS.glob(f"{_PREFIX}*"):
        suffix = d.name[len(_PREFIX):]
        if suffix.isdigit() and int(suffix) != os.getpid() and not _alive(int(suffix)):
            log.info("removing the stale pin folder %s (agent pid %s is gone)", d, suffix)
            _remove_dir(d)


def acquire(ctx: object) -> str | None:
    """The pin path for ``ctx``'s programs, counted until :func:`release`; None (with one
    warning) when bpffs cannot be used: the programs then load with a private map each, and
    CUDA spans are not nested under Python / PyTorch calls."""
    global _warned
    path = pin_path(ctx)
    with _lock:
        try:
            ensure_bpffs()
            if not _refs:
                _clean_stale()
            path.parent.mkdir(exist_ok=True)
        except OSError as exc:
            if not _warned:
                _warned = True
                log.warning("the cuda/python/torch programs cannot share their per-thread call map on %s (%s): "
                            "CUDA spans will not be nested under Python functions or PyTorch operators", BPFFS, exc)
            return None
        _refs[str(path)] = _refs.get(str(path), 0) + 1
    return str(path)


def release(path: str | None) -> None:
    """One user of ``path`` less; the last one removes the pin (and the agent's folder when empty)."""
    if path is None:
        return
    with _lock:
        n = _refs.get(path, 0) - 1
        if n > 0:
            _refs[path] = n
            return
        _refs.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def unpin(ctx: object) -> None:
    """Remove ``ctx``'s pin once every program that shares the map is loaded: the programs keep
    the map alive, and an agent SIGKILLed later leaves nothing behind on bpffs. Programs
    compiled after this get a private map (no nesting); the agent compiles only at start."""
    path = pin_path(ctx)
    with _lock:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(path.parent)


def register_ops(ctx: object, lookup: Callable[[int, int], str | None]) -> None:
    """The torch receiver's (pid, entry address) -> operator name, for ``ctx``."""
    with _lock:
        _ops[id(ctx)] = lookup


def unregister_ops(ctx: object) -> None:
    with _lock:
        _ops.pop(id(ctx), None)


def op_name(ctx: object, pid: int, address: int) -> str | None:
    """The operator at ``address`` in ``pid`` (a torch receiver of ``ctx`` knows it), else None."""
    with _lock:
        lookup = _ops.get(id(ctx))
    if lookup is None or not address:
        return None
    try:
        return lookup(pid, address)
    except Exception:
        return None
