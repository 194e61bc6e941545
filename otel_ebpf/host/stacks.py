"""The live Python stack of every thread of a process, read from outside it with py-spy.

:func:`capture` runs ``py-spy dump --pid PID --json`` (py-spy >= 0.4.1, a PyPI dependency: it reads
CPython's frames with ``process_vm_readv``, the target needs no change) and returns a
:class:`StackCapture`: per thread its id, name, idle/active/GIL state and frames (innermost
first, as py-spy gives them), plus a text rendering like ``py-spy dump``'s, bounded.

**The target is never left stopped by us.** By default py-spy runs ``--nonblocking``: it only
reads the target's memory and never stops it (ptrace is not attached at all), at the price of a
stack that may be torn if the thread moves while it is read; the ranks we capture are silent
(waiting), so their stacks hold still. ``native=True`` needs py-spy's blocking mode (py-spy
refuses ``--native`` with ``--nonblocking``): py-spy then stops every thread with
``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT`` (remoteprocess 0.5, PR benfred/remoteprocess#83, used by
py-spy 0.4.1) for the few ms it reads, and detaches when done. The stop is bounded by
``timeout_s``: past it py-spy is killed (SIGKILL), and a dead tracer's tracees are detached and
restarted by the kernel (ptrace(2), "If the tracer dies, all tracees are automatically detached
and restarted, unless they were in group-stop"; INTERRUPT stops are not group-stops, and no
SIGSTOP is ever sent, so none is left pending).

Failures are outcomes, not exceptions (:data:`Outcome`): ``exited`` (no such process, or it ended
during the capture: checked against its start time in /proc, so a reused pid is ``exited`` too),
``not_python`` (py-spy found no interpreter; with ``native`` the threads' kernel stacks from
/proc instead), ``permission`` (no ptrace access: the message says how to grant it), ``timeout``,
``missing`` (no py-spy executable), ``busy`` (a capture of that pid is running, or every slot is
taken past the timeout), ``error`` (anything else, with py-spy's message).

Thread safety: :func:`capture` may be called from any thread. At most one capture per pid runs at
once and at most :data:`MAX_CONCURRENT` overall (process-wide). It blocks up to ``timeout_s``, plus
0.1 s after a failed read (to tell a target that was dying from other failures) and the reaping of a
killed py-spy; it never raises for a bad pid or a failed capture.
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from otel_ebpf.host.procfs import GONE_STATES, stat_fields

__all__ = ["MAX_CONCURRENT", "Frame", "Outcome", "StackCapture", "ThreadStack", "capture", "find_py_spy"]

Outcome = Literal["ok", "exited", "not_python", "permission", "timeout", "missing", "busy", "error"]
MAX_CONCURRENT = 2  # py-spy processes at once, process-wide
_MAX_OUTPUT = 8 << 20  # py-spy's stdout + stderr read at most (a 1000-thread process's JSON is ~2.5 MB)
_EXIT_GRACE_S = 0.1  # after a failed read: how long a dying target may take to show as gone
_NOT_PYTHON = ("Failed to find python version", "Failed to find a python interpreter")
_PERMISSION = ("Permission Denied", "Operation not permitted", "os error 1)")
_FIX_PERMISSION = (
    "reading another process's memory needs ptrace access: give the agent CAP_SYS_PTRACE (docker: "
    "--cap-add SYS_PTRACE; Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]) or run it as the "
    "target's user, and kernel.yama.ptrace_scope below 3 (with 1, a non-descendant needs CAP_SYS_PTRACE; "
    "sysctl -w kernel.yama.ptrace_scope=1)")

_slots = threading.BoundedSemaphore(MAX_CONCURRENT)
_inflight: set[int] = set()
_inflight_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Frame:
    """One call: ``function``, ``file`` (full path as py-spy read it; a library for a native frame,
    ``[kernel]`` for a kernel one) and ``line`` (0: unknown)."""

    function: str
    file: str
    line: int

    @property
    def is_python(self) -> bool:
        """A Python frame (py-spy gives native ones no line; kernel ones are ``[kernel]``)."""
        return self.file.endswith(".py") or (self.line > 0 and self.file != "[kernel]")


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread: ``tid`` (OS thread id; py-spy's Python thread id when it gives none),
    ``name`` (Python thread name, else the OS's comm), ``active`` (running, not waiting),
    ``gil`` (holding the GIL; None: unknown), ``frames`` innermost first, at most ``max_frames``:
    ``frames_dropped`` outer frames were left off."""

    tid: int
    name: str | None
    active: bool | None
    gil: bool | None
    frames: tuple[Frame, ...]
    frames_dropped: int = 0


@dataclass(frozen=True, slots=True)
class StackCapture:
    """What one capture of ``pid`` gave. ``outcome`` ok: ``threads`` has at least one thread.
    ``message``: why not ok (empty when ok). ``text``: the rendering, main thread first, at most
    ``max_bytes`` UTF-8 bytes; ``truncated_bytes`` were cut from its end (``truncated``).
    ``threads_dropped``: threads beyond ``max_threads``. ``duration_s``: wall time of the capture."""

    pid: int
    outcome: Outcome
    message: str = ""
    threads: tuple[ThreadStack, ...] = ()
    text: str = ""
    truncated_bytes: int = 0
    threads_dropped: int = 0
    duration_s: float = 0.0
    native: bool = False

    @property
    def truncated(self) -> bool:
        return self.truncated_bytes > 0 or self.threads_dropped > 0

    def main_thread(self) -> ThreadStack | None:
        """The thread whose id is the pid (the main thread on Linux), else the first one."""
        return next((t for t in self.threads if t.tid == self.pid), self.threads[0] if self.threads else None)

    def innermost(self) -> Frame | None:
        """The main thread's innermost Python frame (native and kernel frames skipped), None when
        it has none."""
        main = self.main_thread()
        return next((f for f in main.frames if f.is_python), None) if main is not None else None


def find_py_spy() -> str | None:
    """The py-spy executable: next to ``sys.executable`` (a venv's bin), in this interpreter's scripts
    directory (where the wheel installs it), then on PATH. None when there is none."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        exe = folder / "py-spy"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("py-spy")


def capture(pid: int, *, native: bool = False, timeout_s: float = 2.0, max_bytes: int = 16384,
            max_frames: int = 64, max_threads: int = 128, executable: str | None = None) -> StackCapture:
    """The stacks of ``pid`` (module docstring: modes, outcomes, threading). ``native``: add native
    frames (py-spy's blocking mode: the target is stopped for the read, never past ``timeout_s``).
    ``executable``: a py-spy to use instead of :func:`find_py_spy`'s. Never raises for a bad pid."""
    t0 = time.monotonic()
    exe = executable or find_py_spy()
    if exe is None:
        return StackCapture(pid, "missing", "py-spy not found (looked next to "
                            f"{sys.executable}, in {sysconfig.get_path('scripts')} and on PATH): "
                            "pip install 'py-spy>=0.4.1' in the agent's environment", native=native)
    with _inflight_lock:
        if pid in _inflight:
            return StackCapture(pid, "busy", f"a capture of pid {pid} is already running", native=native)
        _inflight.add(pid)
    try:
        if not _slots.acquire(timeout=timeout_s):
            return StackCapture(pid, "busy", f"{MAX_CONCURRENT} captures already running", native=native)
        try:
            result = _capture(exe, pid, native, timeout_s, max_frames, max_threads)
        finally:
            _slots.release()
    finally:
        with _inflight_lock:
            _inflight.discard(pid)
    outcome, message, threads, dropped = result
    text, cut = _render(pid, threads, max_bytes)
    return StackCapture(pid, outcome, message, threads, text, cut, dropped, time.monotonic() - t0, native)


_Result = tuple[Outcome, str, tuple[ThreadStack, ...], int]


def _capture(exe: str, pid: int, native: bool, timeout_s: float, max_frames: int, max_threads: int) -> _Result:
    started = _start_time(pid)
    if started is None:
        return "exited", f"no process {pid}", (), 0
    argv = [exe, "dump", "--pid", str(pid), "--json", "--native" if native else "--nonblocking"]
    rc, out, err, why = _run(argv, timeout_s)
    if _ended(pid, started, _EXIT_GRACE_S if why or rc != 0 else 0.0):
        return "exited", f"process {pid} exited during the capture", (), 0
    if why:
        return ("timeout" if why.startswith("no answer") else "error"), why, (), 0
    message = _first_error_line(err)
    if rc != 0:
        if any(s in err for s in _PERMISSION):
            scope = _ptrace_scope()
            return "permission", (f"no ptrace permission on pid {pid} ({message}; kernel.yama.ptrace_scope="
                                  f"{scope}): {_FIX_PERMISSION}"), (), 0
        if any(s in err for s in _NOT_PYTHON):
            kernel, dropped = _kernel_stacks(pid, max_frames, max_threads) if native else ((), 0)
            return "not_python", f"no Python frames: {message}", kernel, dropped
        return "error", f"py-spy exited with {rc}: {message or 'no message'}", (), 0
    try:
        threads, dropped = _parse(json.loads(out), max_frames, max_threads)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return "error", f"py-spy's JSON could not be read: {exc}", (), 0
    if not threads:
        return "not_python", "no Python frames: py-spy found no Python thread", (), 0
    return "ok", "", threads, dropped


def _run(argv: list[str], timeout_s: float) -> tuple[int | None, bytes, str, str]:
    """(exit code, stdout, stderr text, why it failed: '' when it ran to its end). Kills the child
    past ``timeout_s`` or past :data:`_MAX_OUTPUT` bytes of output; always reaps it."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                close_fds=True, env={**os.environ, "RUST_BACKTRACE": "0"})
    except OSError as exc:
        return None, b"", "", f"cannot run {argv[0]}: {exc.strerror or exc}"
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}  # type: ignore[union-attr]
    deadline, size, why = time.monotonic() + timeout_s, 0, ""
    try:
        with selectors.DefaultSelector() as sel:
            for fd in chunks:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map() and not why:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f"no answer from py-spy within {timeout_s:g}s: killed it"
                    break
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fd)
                    chunks[key.fd].append(data)
                    size += len(data)
                    if size > _MAX_OUTPUT:
                        why = f"py-spy wrote more than {_MAX_OUTPUT} bytes: killed it"
        if not why:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = f"no answer from py-spy within {timeout_s:g}s: killed it"
    finally:
        if proc.poll() is None:
            proc.kill()  # SIGKILL: the kernel detaches and restarts its tracees (module docstring)
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    out, err = (b"".join(c) for c in chunks.values())
    return proc.returncode, out, err.decode("utf-8", "replace"), why


def _ended(pid: int, started: bytes, grace_s: float) -> bool:
    """``pid`` is no longer the process that started at ``started``, now or within ``grace_s``: a process
    being killed loses its memory (py-spy fails) a little before it turns zombie."""
    deadline = time.monotonic() + grace_s
    while _start_time(pid) == started:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _start_time(pid: int) -> bytes | None:
    """proc(5) field 22 (start time in clock ticks) of a live process; None: gone or a zombie."""
    fields = stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0][:1] in GONE_STATES:
        return None
    return fields[19]


def _first_error_line(err: str) -> str:
    """py-spy's error: the first non-empty stderr line (what follows is a Rust backtrace)."""
    for line in err.splitlines():
        line = line.strip()
        if line and not line.startswith("Stack backtrace"):
            return line.removeprefix("Error: ")
    return ""


def _ptrace_scope() -> str:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "absent (no Yama)"


def _parse(traces: Any, max_frames: int, max_threads: int) -> tuple[tuple[ThreadStack, ...], int]:
    """py-spy's JSON (a list of StackTrace, py-spy src/stack_trace.rs) -> threads, threads dropped."""
    if not isinstance(traces, list):
        raise ValueError(f"expected a list of threads, got {type(traces).__name__}")
    threads = []
    for t in traces[:max_threads]:
        frames = [Frame(str(f["name"]), str(f["filename"]), int(f.get("line") or 0)) for f in t["frames"]]
        tid = t.get("os_thread_id") or int(t["thread_id"])
        threads.append(ThreadStack(int(tid), t.get("thread_name"), bool(t.get("active")), bool(t.get("owns_gil")),
                                   tuple(frames[:max_frames]), max(0, len(frames) - max_frames)))
    return tuple(threads), max(0, len(traces) - max_threads)


def _kernel_stacks(pid: int, max_frames: int, max_threads: int) -> tuple[tuple[ThreadStack, ...], int]:
    """Each thread's kernel stack from /proc/PID/task/TID/stack (root only; empty frames otherwise),
    the native stack there is for a process without an interpreter, and threads dropped."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        return (), 0
    threads = []
    for tid in tids[:max_threads]:
        base = f"/proc/{pid}/task/{tid}"
        frames: list[Frame] = []
        try:
            name: str | None = Path(f"{base}/comm").read_text().strip()
            state = (stat_fields(tid) or [b"?"])[0][:1]
            for line in Path(f"{base}/stack").read_text().splitlines():
                frames.append(Frame(line.split("] ", 1)[-1].split("+", 1)[0], "[kernel]", 0))
        except OSError:  # the thread ended, or the stack file is root-only
            name, state = None, b"?"
        threads.append(ThreadStack(tid, name, state == b"R", None, tuple(frames[:max_frames]),
                                   max(0, len(frames) - max_frames)))
    return tuple(threads), max(0, len(tids) - max_threads)


def _render(pid: int, threads: tuple[ThreadStack, ...], max_bytes: int) -> tuple[str, int]:
    """``py-spy dump``'s text (main thread first), cut to ``max_bytes`` UTF-8 bytes: (text, bytes cut)."""
    ordered = sorted(threads, key=lambda t: t.tid != pid)
    lines = []
    for t in ordered:
        state = "idle" if t.active is False else "active+gil" if t.gil else "active" if t.active else "?"
        lines.append(f"Thread {t.tid} ({state})" + (f': "{t.name}"' if t.name else ""))
        for f in t.frames:
            where = os.path.basename(f.file) if f.file != "[kernel]" else f.file
            lines.append(f"    {f.function} ({where}:{f.line})" if f.line else f"    {f.function} ({where})")
        if t.frames_dropped:
            lines.append(f"    ... {t.frames_dropped} outer frames left off")
    data = "\n".join(lines).encode()
    if len(data) <= max_bytes:
        return data.decode(), 0
    return data[:max_bytes].decode("utf-8", "ignore"), len(data) - max_bytes
