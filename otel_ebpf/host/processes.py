"""Resource attributes of a traced process, by OpenTelemetry semantic-convention names.

Contract, for every function here:

* Nothing raises for a process that has exited or whose ``/proc`` files are unreadable:
  what could be read is returned, the rest is left out.
* ``/proc`` content is untrusted (a process controls its own argv, comm and environment).
  Control characters (C0, C1, bidi overrides, line separators) are stripped and every string
  is capped: ``process.command_line`` at :data:`MAX_COMMAND_LINE_CHARS` (4096) characters,
  ``process.command_args`` at 256 per argument and 4096 in all, every other string at
  :data:`MAX_VALUE_CHARS` (256). Reads are capped too (cmdline 128 KiB, environ 1 MiB).
  Truncation is silent (no marker).
* Only the environment variables named in :data:`ENV_VARIABLES` are ever read out of
  ``/proc/PID/environ``; no other value leaves this module.
* Secrets in the command line are redacted by :func:`redact_command_line` before export
  (:mod:`otel_ebpf.host.redact`, re-exported here).

Rank precedence (first source that holds a non-negative integer wins): torchrun
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) over Open MPI
(``OMPI_COMM_WORLD_*``) over MPICH (``PMI_RANK``, ``PMI_SIZE``) over Slurm (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``): a launcher nested in ``srun`` sets the
inner, more specific values.

Layout: cgroup parsing is :mod:`otel_ebpf.host.cgroups`, the host's and the services' own
resources :mod:`otel_ebpf.host.identity`, attribute types and text cleaning
:mod:`otel_ebpf.host.attributes`.
"""
from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from opentelemetry.semconv._incubating.attributes import host_attributes as _host
from opentelemetry.semconv._incubating.attributes import process_attributes as _proc
# container.id and k8s.pod.uid are stable only in recent semconv; the incubating names are the
# same strings and exist in every version pyproject allows (>=0.48b0).
from opentelemetry.semconv._incubating.attributes.container_attributes import CONTAINER_ID
from opentelemetry.semconv._incubating.attributes.k8s_attributes import K8S_POD_UID
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

from otel_ebpf.host.attributes import MAX_VALUE_CHARS, AttributeValue, Attributes, clean as _clean
from otel_ebpf.host.cgroups import container_id_from_cgroup, pod_uid_from_cgroup
from otel_ebpf.host.cmdline import MAX_CMDLINE_READ as _MAX_CMDLINE_READ
from otel_ebpf.host.cmdline import MAX_COMMAND_LINE_CHARS
from otel_ebpf.host.cmdline import command_attributes as _command_attributes
from otel_ebpf.host.cmdline import exec_attributes
from otel_ebpf.host.exec_hints import ExecHints, apply_hint, describes
from otel_ebpf.host.identity import host_attributes
from otel_ebpf.host.k8s import DOWNWARD_ENV_NAMES, K8sMetadata
from otel_ebpf.host.redact import DEFAULT_REDACT_PATTERNS, REDACTED, redact_command_line

__all__ = [
    "CUDA_VISIBLE_DEVICES", "DEFAULT_REDACT_PATTERNS", "ENV_VARIABLES", "MAX_COMMAND_LINE_CHARS",
    "MAX_VALUE_CHARS", "ML_LOCAL_RANK", "ML_LOCAL_WORLD_SIZE", "ML_MASTER_ADDR", "ML_NODE_RANK", "ML_RANK",
    "ML_WORLD_SIZE", "REDACTED", "SLURM_JOB_ID", "SLURM_STEP_ID", "AttributeValue", "Attributes",
    "ResourceCache", "process_attributes", "process_environment", "redact_command_line",
]

# otel-ebpf's own attribute namespace: semantic conventions have no names for these yet.
ML_RANK = "ml.rank"
ML_LOCAL_RANK = "ml.local_rank"
ML_WORLD_SIZE = "ml.world_size"
ML_LOCAL_WORLD_SIZE = "ml.local_world_size"
ML_NODE_RANK = "ml.node_rank"
ML_MASTER_ADDR = "ml.master_addr"
SLURM_JOB_ID = "slurm.job.id"
SLURM_STEP_ID = "slurm.step.id"
CUDA_VISIBLE_DEVICES = "cuda.visible_devices"

_MAX_ENVIRON_READ = 1024 * 1024
_MAX_SMALL_READ = 64 * 1024

#: Integer attributes from the environment, sources in precedence order (torchrun, MPI, Slurm).
_INT_SOURCES: dict[str, tuple[str, ...]] = {
    ML_RANK: ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    ML_LOCAL_RANK: ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
    ML_WORLD_SIZE: ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
    ML_LOCAL_WORLD_SIZE: ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ML_NODE_RANK: ("GROUP_RANK", "SLURM_NODEID"),
}
_STR_SOURCES: dict[str, str] = {
    ML_MASTER_ADDR: "MASTER_ADDR", SLURM_JOB_ID: "SLURM_JOB_ID", SLURM_STEP_ID: "SLURM_STEP_ID",
    CUDA_VISIBLE_DEVICES: "CUDA_VISIBLE_DEVICES", SERVICE_NAME: "OTEL_SERVICE_NAME",
}
#: Read for GPU identity (otel_ebpf.host.gpus) and Kubernetes names (otel_ebpf.host.k8s), not exported as such.
_GPU_ENV = frozenset(("CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"))
#: The only environment variables ever read from /proc/PID/environ.
ENV_VARIABLES = (frozenset(v for vs in _INT_SOURCES.values() for v in vs) | frozenset(_STR_SOURCES.values())
                 | _GPU_ENV | DOWNWARD_ENV_NAMES)

log = logging.getLogger(__name__)
_UINT = re.compile(r"^[0-9]{1,19}$")  # /proc/PID/stat numbers
_SMALL_UINT = re.compile(r"^[0-9]{1,9}$")  # ranks and sizes from the environment


# --- /proc reading -----------------------------------------------------------------------------

def _read(proc_root: str, pid: int, name: str, limit: int = _MAX_SMALL_READ) -> bytes | None:
    try:
        with open(f"{proc_root}/{pid}/{name}", "rb") as f:
            return f.read(limit)
    except (OSError, ValueError, OverflowError):
        return None


def _stat(proc_root: str, pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, start time in clock ticks since boot) from /proc/PID/stat, or None."""
    raw = _read(proc_root, pid, "stat")
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    head, sep, tail = text.rpartition(")")  # comm may itself hold ')' and spaces
    fields = tail.split()
    if not sep or len(fields) < 20 or not _UINT.match(fields[1]) or not _UINT.match(fields[19]):
        return None
    return head.partition("(")[2], int(fields[1]), int(fields[19])  # fields 2 (comm), 4, 22


@functools.lru_cache(maxsize=1024)
def _user_name(uid: int) -> str:
    """User name from the agent's passwd database (may consult NSS; cached), else the uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _owner(proc_root: str, pid: int) -> str | None:
    raw = _read(proc_root, pid, "status") or b""
    for line in raw.split(b"\n"):
        if line.startswith(b"Uid:"):
            fields = line.split()
            if len(fields) > 1 and _UINT.match(fields[1].decode("ascii", "replace")):
                return _clean(_user_name(int(fields[1])))  # the real uid
    return None


def _argv(proc_root: str, pid: int) -> list[str]:
    raw = _read(proc_root, pid, "cmdline", _MAX_CMDLINE_READ) or b""
    if not raw.strip(b"\0"):
        return []  # kernel threads and zombies have no argv
    # Strip control characters before redacting, so a hidden \x01 cannot split a secret key.
    args = [_clean(a.decode("utf-8", "replace"), _MAX_CMDLINE_READ) for a in raw.rstrip(b"\0").split(b"\0")]
    if len(args) == 1 and " " in args[0]:
        args = args[0].split(" ")  # setproctitle() rewrote argv as one string: redact word by word
    return args


def _environ(proc_root: str, pid: int) -> dict[str, str]:
    """The :data:`ENV_VARIABLES` set in the process; other entries are never decoded."""
    raw = _read(proc_root, pid, "environ", _MAX_ENVIRON_READ) or b""
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in ENV_VARIABLES:
            env[name] = _clean(value.decode("utf-8", "replace"))
    return env


def _env_attributes(env: dict[str, str]) -> Attributes:
    attrs: Attributes = {}
    for attr, sources in _INT_SOURCES.items():
        values = [env[s].strip() for s in sources if _SMALL_UINT.match(env.get(s, "").strip())]
        if values:
            attrs[attr] = int(values[0])
    for attr, source in _STR_SOURCES.items():
        if source in env and attr != SERVICE_NAME:
            attrs[attr] = env[source]
    return attrs


def process_attributes(pid: int, *, proc_root: str = "/proc", fallback_comm: str | None = None,
                       service_name: str | None = None,
                       redact: Sequence[str] = DEFAULT_REDACT_PATTERNS) -> Attributes:
    """Resource attributes of process ``pid`` read from ``proc_root``; never raises.

    ``process.executable.name`` is the base name of ``/proc/PID/exe``, else the kernel comm (15
    chars), else ``fallback_comm``. ``service.name`` is the process's own ``OTEL_SERVICE_NAME``
    (so spans line up with an SDK inside the process), else ``service_name`` (the agent-wide
    default), else the executable name, else ``"unknown_service"``. If the PID is reused while
    it is read (start time changes), only the vanished-process attributes are returned.
    Blocking: a few small file reads plus one cached ``getpwuid``.
    """
    return _describe(pid, proc_root, fallback_comm, service_name, redact)[0]


def process_environment(pid: int, *, proc_root: str = "/proc") -> tuple[dict[str, str], bool] | None:
    """(the :data:`ENV_VARIABLES` set in ``pid``'s initial environment, whether it runs in a
    container), or None when ``/proc/PID`` is gone. Never raises."""
    stat = _stat(proc_root, pid)
    if stat is None:
        return None
    env = _environ(proc_root, pid)
    cgroup = (_read(proc_root, pid, "cgroup") or b"").decode("utf-8", "replace")
    again = _stat(proc_root, pid)
    if again is None or again[2] != stat[2]:
        return None
    return env, container_id_from_cgroup(cgroup) is not None


def _describe(pid: int, proc_root: str, fallback_comm: str | None, service_name: str | None,
              redact: Sequence[str]) -> tuple[Attributes, dict[str, str]]:
    """:func:`process_attributes` and the environment subset it was computed from."""
    attrs: Attributes = {_proc.PROCESS_PID: pid, _host.HOST_NAME: host_attributes()[_host.HOST_NAME]}
    stat = _stat(proc_root, pid)
    name = _clean(fallback_comm) if fallback_comm else None
    env: dict[str, str] = {}
    if stat is not None:
        attrs.update(_read_live(proc_root, pid, stat, redact))
        env = _environ(proc_root, pid)
        attrs.update(_env_attributes(env))
        again = _stat(proc_root, pid)  # compare start times only: comm changes (pt_main_thread)
        if again is None or again[2] != stat[2]:  # exited, maybe reused, under us: drop the mixture
            attrs, env = {_proc.PROCESS_PID: pid, _host.HOST_NAME: attrs[_host.HOST_NAME]}, {}
        else:
            name = str(attrs.get(_proc.PROCESS_EXECUTABLE_NAME, "")) or _clean(stat[0]) or name
    if name:
        attrs[_proc.PROCESS_EXECUTABLE_NAME] = name
    service = env.get("OTEL_SERVICE_NAME") or (_clean(service_name) if service_name else None) or name
    attrs[SERVICE_NAME] = service or "unknown_service"
    return attrs, env


def _read_live(proc_root: str, pid: int, stat: tuple[str, int, int], redact: Sequence[str]) -> Attributes:
    attrs: Attributes = {_proc.PROCESS_PARENT_PID: stat[1]}
    try:
        exe = os.readlink(f"{proc_root}/{pid}/exe")
        exe = _clean(exe.removesuffix(" (deleted)"), _MAX_CMDLINE_READ)
        attrs[_proc.PROCESS_EXECUTABLE_PATH] = exe[:MAX_VALUE_CHARS]
        if os.path.basename(exe):  # of the whole path, before the cap
            attrs[_proc.PROCESS_EXECUTABLE_NAME] = os.path.basename(exe)[:MAX_VALUE_CHARS]
    except (OSError, ValueError):
        pass  # EACCES without CAP_SYS_PTRACE, ENOENT for kernel threads: fall back to comm
    owner = _owner(proc_root, pid)
    if owner is not None:
        attrs[_proc.PROCESS_OWNER] = owner
    cgroup = (_read(proc_root, pid, "cgroup") or b"").decode("utf-8", "replace")
    for key, value in ((CONTAINER_ID, container_id_from_cgroup(cgroup)),
                       (K8S_POD_UID, pod_uid_from_cgroup(cgroup))):
        if value:
            attrs[key] = value
    attrs.update(_command_attributes(_argv(proc_root, pid), redact))
    return attrs


# --- cache -------------------------------------------------------------------------------------

class ResourceCache:
    """LRU cache of :func:`process_attributes` keyed by (pid, process start time).

    The start time (``/proc/PID/stat`` field 22) is read on every :meth:`get` (one small read),
    so a PID reused after exit is recomputed rather than served the old process's attributes.
    When the start time is unreadable (the process is gone), a cached entry for the PID is
    served as is; a miss then is computed with ``fallback_comm`` and *not* cached. Thread-safe:
    one lock guards the map and counters; ``/proc`` is read outside it. ``hits``, ``misses`` and
    ``evictions`` (entries dropped by LRU overflow, :meth:`evict` or PID reuse) are plain ints.
    Returned dicts are shared: do not mutate them. A process gone before ``/proc`` could be read
    gets what the kernel reported of it (:meth:`hint`; ``hints``: :class:`~otel_ebpf.host.exec_hints.ExecHints`).

    ``k8s`` (:class:`otel_ebpf.host.k8s.K8sMetadata`): adds ``k8s.pod.name``, ``k8s.namespace.name``,
    ``k8s.container.name``, ``k8s.node.name`` to a process in a pod, computed once per entry (a
    miss may then wait for one kubelet fetch, bounded by its timeout and refresh interval).
    """

    def __init__(self, max_entries: int = 4096, *, proc_root: str = "/proc",
                 service_name: str | None = None, redact: Sequence[str] = DEFAULT_REDACT_PATTERNS,
                 k8s: K8sMetadata | None = None) -> None:
        self.max_entries = max(1, max_entries)
        self._proc_root, self._service_name, self._redact = proc_root, service_name, tuple(redact)
        self._k8s = k8s
        # pid -> (start time, attributes, environment, time.monotonic_ns() when the read began)
        self._entries: OrderedDict[int, tuple[int, Attributes, dict[str, str], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hints = ExecHints(self.max_entries)
        self._subscribers: list[Callable[[int, Attributes], None]] = []
        self.hits = self.misses = self.evictions = 0
        self.overflows = 0  # of the evictions: entries dropped for room (max_entries), not for an exit or reuse
        self.refreshes_skipped = 0  # refreshes at exec another receiver's read had made already

    def full_evictions(self) -> dict[str, int]:
        """Entries dropped for room so far, cumulative: {"resources": this cache's, "exec_hints": its
        hints'}. An exec hint dropped so is lost for good (its process may be gone); a resource is read again
        from /proc when needed, if its process still lives."""
        return {"resources": self.overflows, "exec_hints": self.hints.evictions}

    def subscribe(self, changed: Callable[[int, Attributes], None]) -> None:
        """Call ``changed(pid, attributes)`` whenever :meth:`refresh` finds ``pid``'s attributes
        different from those served before (an exec: another program, command line, environment),
        so a consumer that built something from the old ones (the Emitter's per-process SDK
        resource) replaces it. Called on the refreshing thread, outside the lock; an exception
        is logged, never raised. Subscribe before the cache is shared between threads."""
        self._subscribers.append(changed)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, pid: int, fallback_comm: str | None = None) -> Attributes:
        """Attributes of ``pid``, computed once per (pid, start time); never raises."""
        return self._hinted(pid, self._entry(pid, fallback_comm))

    def environment(self, pid: int) -> tuple[dict[str, str], bool] | None:
        """(:data:`ENV_VARIABLES` set in ``pid``'s initial environment, whether it is in a
        container), from the same entry as :meth:`get`; None when never read and now gone."""
        _, attrs, env, _ = self._entry(pid, None)  # /proc only: a hint holds no environment
        if not env and _proc.PROCESS_PARENT_PID not in attrs:
            return None  # nothing of the live process was ever read
        return env, CONTAINER_ID in attrs

    def _entry(self, pid: int, fallback_comm: str | None) -> tuple[int | None, Attributes, dict[str, str], int]:
        """(start time or None when gone, attributes, environment, read time) of ``pid`` from /proc."""
        stat = _stat(self._proc_root, pid)
        with self._lock:
            entry = self._entries.get(pid)
            if entry is not None and (stat is None or entry[0] == stat[2]):
                self._entries.move_to_end(pid)
                self.hits += 1
                return entry
            self.misses += 1
        read_ns = time.monotonic_ns()
        attrs, env = self._read(pid, fallback_comm)
        if stat is None:
            return None, attrs, env, read_ns
        with self._lock:
            old = self._entries.get(pid)
            if old is not None and old[0] == stat[2]:  # filled while we read (a refresh at exec is newer)
                self._entries.move_to_end(pid)
                entry = old
            else:
                old = self._entries.pop(pid, None)
                if old is not None and old[0] != stat[2]:
                    self.evictions += 1  # PID reuse: the old process's entry (not a racing thread's)
                entry = self._entries[pid] = (stat[2], attrs, env, read_ns)
                self._bound()
        return entry

    def _hinted(self, pid: int, entry: tuple[int | None, Attributes, dict[str, str], int]) -> Attributes:
        """The entry's attributes completed by the kernel's hint for ``pid`` (:meth:`hint`) when the
        ``/proc`` read missed (the process had exited) or began before the exec; a complete read
        after the exec is served as read. A hint of an earlier process of the pid is not used."""
        start, attrs, _, read_ns = entry
        hint = self.hints.get(pid)
        if hint is None:
            return attrs
        read = _proc.PROCESS_PARENT_PID in attrs  # else a miss: the name, if any, is a fallback comm
        after_exec = hint.exec_ns is None or (read and hint.exec_ns <= read_ns)
        if after_exec and read and _proc.PROCESS_COMMAND_LINE in attrs:
            return attrs  # /proc wins
        if start is not None and not describes(hint, start):
            return attrs  # the pid's later process
        return apply_hint(attrs, hint, after_exec=after_exec)

    def hint(self, pid: int, time_ns: int, *, ppid: int | None = None, filename: str | None = None,
             argv: Sequence[str] | None = None) -> None:
        """What the kernel reported of ``pid``, for when ``/proc/PID`` cannot be read in time: its fork
        at ``time_ns`` (``bpf_ktime_get_ns()``, CLOCK_MONOTONIC) with parent ``ppid`` (``argv`` None), or
        its exec at ``time_ns`` of ``filename`` with ``argv`` as the caller passed it. Cleaned, redacted and
        capped as ``/proc`` content is, at once (nothing unredacted is kept); served by :meth:`get` only to
        fill what ``/proc`` did not give (:func:`otel_ebpf.host.exec_hints.apply_hint`). Call from the
        receiver's poll thread as the record is decoded, before the event goes down the pipeline (the
        Emitter builds a process's resource at its first record). Subscribers are not called. Never raises."""
        attrs: Attributes = {} if ppid is None else {_proc.PROCESS_PARENT_PID: ppid}
        if argv is None:
            self.hints.fork(pid, time_ns, attrs)
        else:
            self.hints.exec(pid, time_ns, {**attrs, **exec_attributes(filename or "", argv, self._redact)})

    def _bound(self) -> None:
        """Drop least recently used entries beyond ``max_entries`` (lock held)."""
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1
            self.overflows += 1

    def _read(self, pid: int, fallback_comm: str | None) -> tuple[Attributes, dict[str, str]]:
        """The process's attributes (Kubernetes ones included) and environment subset, read now."""
        attrs, env = _describe(pid, self._proc_root, fallback_comm, self._service_name, self._redact)
        if self._k8s is not None:
            pod, container = attrs.get(K8S_POD_UID), attrs.get(CONTAINER_ID)
            attrs.update(self._k8s.attributes(pod if isinstance(pod, str) else None,
                                              container if isinstance(container, str) else None, env))
        return attrs, env

    def refresh(self, pid: int, exec_ns: int | None = None) -> None:
        """Read ``pid`` again now (call at exec: it keeps pid and start time, not the program or the
        environment) and replace its entry, but only with a complete read of the live process: when it
        has exited meanwhile, what was read before stays (every receiver sees the exec, each on its own
        thread; one that gets to it after the process exited must not throw away what another read
        after the exec, while the process lived). ``exec_ns``: when the exec happened (CLOCK_MONOTONIC,
        the kernel's record): an entry whose read began after it describes the new program already
        (another receiver's refresh of the same exec), so nothing is read again: one /proc read per exec,
        not one per receiver. Counted in ``refreshes_skipped``."""
        if exec_ns is not None:
            with self._lock:
                entry = self._entries.get(pid)
                if entry is not None and entry[3] > exec_ns:
                    self.refreshes_skipped += 1
                    return
        stat = _stat(self._proc_root, pid)
        if stat is None:
            return
        read_ns = time.monotonic_ns()
        attrs, env = self._read(pid, None)
        if _proc.PROCESS_PARENT_PID not in attrs:
            return  # exited (or reused) during the read
        with self._lock:
            old = self._entries.pop(pid, None)
            self._entries[pid] = (stat[2], attrs, env, read_ns)
            self._bound()
        if old is not None and old[1] == attrs:
            return  # another receiver's refresh of the same exec got here first
        for changed in self._subscribers:
            try:
                changed(pid, attrs)
            except Exception:  # a subscriber's fault must not reach a receiver's poll loop
                log.exception("resource change subscriber %r failed for pid %d", changed, pid)

    def evict(self, pid: int) -> None:
        """Forget ``pid`` (call on process exit). No-op when absent."""
        with self._lock:
            if self._entries.pop(pid, None) is not None:
                self.evictions += 1
