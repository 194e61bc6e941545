"""The agent: builds pipelines from an AgentConfig, starts them, and stops them in order.

Start order: emitters, processors, queues, the ticker, receivers (which load BPF and attach). With
``defer_stages`` (``run -- CMD``'s deferred start) the emitters and processors are built on a thread while the
first receivers compile, and started after them (otel_ebpf.service.stages).
The ticker puts a ``Tick`` into every pipeline each :data:`TICK_INTERVAL_S`, so stages with timeouts
act while no data flows (nccl_watch: a hung job makes no NCCL call).
Stop order is the reverse and drains every stage into the next, so nothing collected is lost:
receivers read their ring buffers dry, queues hand over what they hold, processors flush
pending state (e.g. leak reports), emitters export the last metrics and spans.

``run -- COMMAND`` forks the command first, held on a pipe until the receivers that must see it
from its first instruction and the library gate are loaded (or, ``service.deferred_start: false``,
every receiver); the gate holds a process that opens libcudart/libnccl before their receivers are
attached (otel_ebpf.service.deferred), so its first CUDA call is still traced. Its PID seeds the
in-kernel set of traced processes, which follows fork() in the kernel.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.service import components
from otel_ebpf.emit.exporter_config import check_output_directory, unreachable_endpoints
from otel_ebpf.core.errors import OtelEbpfError, TargetError
from otel_ebpf.host.timeline import HostStats
from otel_ebpf.bpf.clock import KernelClock
from otel_ebpf.core.events import Tick
from otel_ebpf.core.telemetry import CACHE_EVICTIONS, DROPPED, is_lost
from otel_ebpf.core.pipeline import BoundedQueue, Consumer, Context, Fanout
from otel_ebpf.host import gpus
from otel_ebpf.host.k8s import K8sMetadata
from otel_ebpf.host.processes import ResourceCache
from otel_ebpf.service.settings import AgentConfig
from otel_ebpf.service.stages import Builder, Pipeline, build_pipelines

__all__ = ["Agent", "PausedChild", "exit_status"]

log = logging.getLogger(__name__)
TICK_INTERVAL_S = 1.0  # how often every pipeline gets a Tick (nccl_watch's silence checks)
_WAIT_SLICE_S = 1.0  # the longest the main thread sleeps in a wait: a missed wakeup costs at most this


class PausedChild:
    """A forked child that execs ``argv`` only when :meth:`release` is called, with ``env`` added to the
    environment it inherits."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        if not argv:
            raise TargetError("no command given after --")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: wait for the go byte, then become the command
            os.close(w)
            go = os.read(r, 1)
            if not go:
                os._exit(125)
            try:
                os.environ.update(env or {})
                os.execvp(argv[0], list(argv))
            except OSError as exc:
                sys.stderr.write(f"otel-ebpf: cannot run {argv[0]!r}: {exc.strerror}\n")
                os._exit(127)
        os.close(r)
        self.pid, self._w = pid, w

    def release(self) -> None:
        if self._w >= 0:
            os.write(self._w, b"x")
            os.close(self._w)
            self._w = -1

    def abort(self) -> None:
        """Never run the command (closing the pipe makes the child exit 125)."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def command_environment(cfg: AgentConfig, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """What ``run -- CMD`` adds to the command's environment, and the line that says so ("" for nothing):
    the NCCL profiler plugin (:func:`_nccl_environment`) and the Python profile hook
    (:func:`_python_hook_environment`)."""
    env, line = _nccl_environment(cfg, environ)
    hook_env, hook_line = _python_hook_environment(cfg, {**environ, **env})
    env.update(hook_env)
    return env, "; ".join(x for x in (line, hook_line) if x)


def _python_hook_environment(cfg: AgentConfig, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """``PYTHONPATH`` with the profile-hook sitecustomize first, when a pipeline has a python receiver with
    ``profile_hook`` (receivers/python/hook/sitecustomize.py: CPython 3.11-3.14 fire the entry probe only
    while a profile function is set)."""
    rcfgs = [cfg.receivers[rid] for p in cfg.service.pipelines.values() for rid in p.receivers
             if rid.split("/")[0] == "python"]
    if not any(getattr(c, "profile_hook", False) for c in rcfgs):
        return {}, ""
    from otel_ebpf.receivers.python import HOOK_DIR

    old = environ.get("PYTHONPATH", "")
    path = f"{HOOK_DIR}{os.pathsep}{old}" if old else str(HOOK_DIR)
    return {"PYTHONPATH": path}, (f"Python profile hook: the command runs with {HOOK_DIR}/sitecustomize.py first on "
                                  "PYTHONPATH (receivers.python.profile_hook; ~0.1 us per Python call)")


def _nccl_environment(cfg: AgentConfig, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """otel-ebpf's NCCL profiler plugin (``NCCL_PROFILER_PLUGIN``) when a pipeline has an nccl receiver with
    ``gpu_time``, the user's own plugin (``chain_plugin``, else ``NCCL_PROFILER_PLUGIN`` as ``environ`` has it)
    chained behind it. A plugin that is not built turns GPU time off, said in the line."""
    from otel_ebpf import nccl_profiler as plug

    rcfgs = [cfg.receivers[rid] for p in cfg.service.pipelines.values() for rid in p.receivers
             if rid.split("/")[0] == "nccl"]
    if not any(getattr(c, "gpu_time", False) for c in rcfgs):
        return {}, ""
    plugin = plug.plugin_path()
    if plugin is None:
        return {}, (f"NCCL GPU time is off: {plug.LIBRARY_NAME} is not built (it needs gcc and sys/sdt.h: apt install "
                    "systemtap-sdt-dev, then reinstall otel-ebpf); receivers.nccl.gpu_time: false silences this")
    base = dict(environ)
    chain = next((c.chain_plugin for c in rcfgs if getattr(c, "chain_plugin", "")), "")
    if chain:
        base[plug.NCCL_ENV] = chain
        base.pop(plug.CHAIN_ENV, None)
    env = plug.launch_env(base, plugin)
    chained = f", chaining {env[plug.CHAIN_ENV]}" if plug.CHAIN_ENV in env else ""
    return env, f"NCCL GPU time: the command runs with {plug.NCCL_ENV}={plugin}{chained}"


def exit_status(status: int) -> int:
    """A shell-style exit code from a waitpid status."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


_FAILED_START_S = 2.0  # shutdown budget after a failed start (then the last metrics' 5 s grace)
# Longest an exiting agent waits, after its flush, for the compile its background starter is in (the starter
# starts no other): LLVM's static destructors run at exit, and one meeting a compile aborted the process
# (SIGABRT, exit -6, once in a CI run of `run -- sh -c 'exit 3'`). A compile takes 0.4-3 s on these VMs.
_STARTER_EXIT_WAIT_S = 30.0


@dataclass
class Agent:
    """Builds and runs every pipeline of ``cfg``. ``start``/``shutdown`` as components."""

    cfg: AgentConfig
    target_pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    # the emitters and processors built in start(), on a thread, while the first receivers compile (run's deferred
    # start: otel_ebpf.service.stages); False: built here
    defer_stages: bool = False

    def __post_init__(self) -> None:
        svc = self.cfg.service
        self.ctx = Context(strict=svc.strict, target_pids=list(self.target_pids),
                           libraries={"command": list(self.command)}, pause_timeout=svc.pause_timeout,
                           clock=KernelClock())  # one kernel clock for every receiver
        self.ctx.host_stats = HostStats(self.ctx.telemetry)
        self.resources = ResourceCache(max_entries=max(2 * svc.max_processes, 64),
                                       service_name=svc.service_name or None,
                                       k8s=K8sMetadata(svc.k8s, self.ctx.telemetry))
        self.ctx.resources = self.resources
        self.ctx.gpus = gpus.attach(self.ctx)  # hw.id for the cuda/nccl processors (NVML loaded lazily)
        self.pipelines: list[Pipeline] = []
        self._queues: dict[str, BoundedQueue] = {}
        self._failing: list[str] = []  # exporters whose endpoint did not answer at the preflight
        self.receivers: dict[str, Any] = {}
        self._started = False
        self._ticks_stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._evictions_seen: dict[str, int] = {}
        self.health: Any = None  # otel_ebpf.service.health.HealthServer while started
        self._deferred: Any = None  # otel_ebpf.service.deferred.DeferredStart once started
        self._build()

    def _build(self) -> None:
        """The queues and receivers; the emitters and processors too unless ``defer_stages``."""
        svc = self.cfg.service
        rfactories = components.receivers()
        feeds: dict[str, list[Consumer]] = {}
        for name, p in svc.pipelines.items():
            self._queues[name] = BoundedQueue(None, self.ctx.telemetry, max_events=svc.max_queue, name=name)
            for rid in p.receivers:
                feeds.setdefault(rid, []).append(self._queues[name])
        for rid, consumers in feeds.items():
            target: Consumer = consumers[0] if len(consumers) == 1 else Fanout(consumers)
            self.receivers[rid] = rfactories[rid.split("/")[0]].create(self.cfg.receivers[rid], self.ctx,
                                                                       target)
        if not self.defer_stages:
            self.pipelines = self._build_stages()

    def _build_stages(self) -> list[Pipeline]:
        return build_pipelines(self.cfg, self.ctx, self.resources, self._queues)

    def dump_programs(self) -> str:
        return "\n".join(f"// ===== receiver {rid}\n{r.dump()}" for rid, r in self.receivers.items()
                         if hasattr(r, "dump"))

    def start(self, *, deferred: bool = False) -> None:
        """Start everything; on a failure, stop what started and re-raise. First the checks that
        need no running part, privileges before the output directories (a user who is not root
        learns that first: as root the directory may well be writable). ``deferred``: return once
        the receivers that must see the command from its start and the library gate are loaded;
        the others load in the background (otel_ebpf.service.deferred)."""
        self._preflight()  # nothing runs yet: nothing to stop, nothing to flush
        self._started = True
        # built meanwhile on a thread of its own (otel_ebpf.service.stages), when deferred
        builder = Builder(self._build_stages) if self.defer_stages and not self.pipelines else None
        try:
            from otel_ebpf.service import health
            self.health = health.serve(self.cfg.service.health_endpoint, health.AGENT_DEFAULT,
                                       health.agent_checks(self), "service.health_endpoint")
            if builder is None:
                self._start_stages()
            from otel_ebpf.service.deferred import DeferredStart, plan

            early, late, gate = plan(self.ctx, self.receivers) if deferred else (self.receivers, {}, None)
            for rid, r in [*early.items(), *([("gate", gate)] if gate is not None else [])]:
                t0 = time.monotonic()
                r.start()
                log.info("receiver %s started in %.2fs", rid, time.monotonic() - t0)
            if builder is not None:
                self.pipelines, builder = builder.result(), None
                self._start_stages()  # what the receivers read meanwhile waited in the queues
            self._deferred = DeferredStart(self.ctx, late, gate, time.monotonic())
            self._deferred.start()  # with nothing late: only the end of the start (programs_loaded)
        except BaseException:
            if builder is not None:
                with contextlib.suppress(Exception):  # what was built is shut down with the rest
                    self.pipelines = builder.result()
            self.shutdown(timeout=_FAILED_START_S)  # nothing collected yet is worth a long wait
            raise

    def _start_stages(self) -> None:
        """Emitters, processors, queues, then the ticker."""
        for p in self.pipelines:
            for eid in self._failing:
                p.emitter.mark_failing(eid)
            p.emitter.start()
            for proc in p.processors:
                proc.start()
            p.queue.start()
        self._ticker = threading.Thread(target=self._tick, name="otel-ebpf-tick", daemon=True)
        self._ticker.start()

    def loading(self) -> list[str]:
        """The receivers still loading in the background (deferred start)."""
        d = self._deferred
        return [] if d is None or d.done.is_set() else [rid for rid in d.late if rid not in d.started
                                                          and rid not in d.failed]

    def failed_receivers(self) -> dict[str, str]:
        """Receivers that failed to start in the background (deferred start), with why."""
        return dict(self._deferred.failed) if self._deferred is not None else {}

    def _tick(self) -> None:
        while not self._ticks_stop.wait(TICK_INTERVAL_S):
            for p in self.pipelines:
                p.queue.offer([Tick(time.time_ns())])  # a full queue wakes the stages anyway: no drop to count
            self._count_evictions()

    def _count_evictions(self) -> None:
        """The host caches' evictions for room since the last call, into CACHE_EVICTIONS."""
        for cache, n in self.resources.full_evictions().items():
            grown = n - self._evictions_seen.get(cache, 0)
            if grown > 0:
                self._evictions_seen[cache] = n
                self.ctx.telemetry.add(CACHE_EVICTIONS, grown, cache=cache, reason="full")

    def _preflight(self) -> None:
        """PrivilegeError/BccMissingError/KernelHeadersError when a BPF receiver cannot load; a
        ConfigError naming ``exporters.<id>.directory`` when a file exporter cannot write. An OTLP
        endpoint that does not resolve or connect within 1 s is a warning naming it (the job still
        runs: a collector may come up later), and its exporter is treated as down until an export
        succeeds (not waited for at shutdown)."""
        from otel_ebpf.bpf.loader import require_bpf
        from otel_ebpf.bpf.receiver import BpfReceiver

        if any(isinstance(r, BpfReceiver) for r in self.receivers.values()):
            require_bpf()
        used = sorted({e for p in self.cfg.service.pipelines.values() for e in p.exporters})
        for eid in used:
            check_output_directory(self.cfg.exporters[eid], f"exporters.{eid}")
        for eid, why in sorted(unreachable_endpoints({e: self.cfg.exporters[e] for e in used}).items()):
            log.warning("exporters.%s.endpoint %s: %s; the job runs anyway, what cannot be sent there is counted "
                        "lost and summed up at exit", eid, self.cfg.exporters[eid].endpoint, why)
            self._failing.append(eid)  # the emitters treat it as down until an export succeeds

    def shutdown(self, *, exiting: bool = False, timeout: float | None = None) -> None:
        """Drain and stop, in order. Safe twice and without start. ``exiting``: this process
        ends right after, so its probes are released by a detached child instead of holding the
        exit ~0.1 s per probe (:func:`otel_ebpf.bpf.loader.hand_off_probes`)."""
        if exiting:
            from otel_ebpf.bpf.loader import hand_off_probes

            hand_off_probes()  # every receiver's probes (USDT ones too), before any is closed
            for r in self.receivers.values():
                if hasattr(r, "detach_in_background"):
                    r.detach_in_background = True
        health, self.health = self.health, None
        if health is not None:
            health.shutdown()
        receivers = self.receivers
        deferred = self._deferred  # kept: failed_receivers() after the shutdown; stop and close_gate run once
        if deferred is not None:  # the gate first (its holds go on), then what started, never a compile's wait
            _quietly(deferred.close_gate, "library gate")
            started = deferred.stop()
            receivers = {rid: r for rid, r in receivers.items() if rid not in deferred.late or rid in started}
        for rid, r in receivers.items():
            _quietly(r.shutdown, f"receiver {rid}")
        self._ticks_stop.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.join()
        self._count_evictions()
        # one budget for handing on the backlog: pipelines, then exporters (service.shutdown_timeout)
        deadline = time.monotonic() + (self.cfg.service.shutdown_timeout if timeout is None else timeout)
        for p in self.pipelines:
            _quietly(functools.partial(p.queue.shutdown, deadline), f"pipeline {p.name} queue")
            for proc in p.processors:
                _quietly(proc.shutdown, f"pipeline {p.name} processor")
            _quietly(functools.partial(p.emitter.shutdown, deadline), f"pipeline {p.name} emitter")
        for name, q in self._queues.items():  # a failed start's queues without stages: what they hold is counted
            if not any(p.queue is q for p in self.pipelines):
                _quietly(functools.partial(q.shutdown, deadline), f"pipeline {name} queue")
        if exiting and deferred is not None:
            deferred.finish(_STARTER_EXIT_WAIT_S)  # no compile may run into the interpreter's exit

    def drops(self, *, lost: bool = True) -> dict[str, int]:
        """{'<where>/<reason>': count} of the drops so far (otel_ebpf.events.dropped) that lost data; with
        ``lost=False``, of those that lost nothing (NOT_LOST_REASONS: what a limit left unrecorded, such as
        deep stacks not nested). An exporter's lost log records as '<exporter>/logs/<reason>'."""
        out: dict[str, int] = {}
        for name, attrs, value in self.ctx.telemetry.snapshot():
            if name == DROPPED and value and is_lost(attrs.get("reason", "")) == lost:
                signal = f"{attrs['signal']}/" if "signal" in attrs else ""
                key = f"{attrs.get('receiver', '?')}/{signal}{attrs.get('reason', '?')}"
                out[key] = out.get(key, 0) + value
        return out

    def deliveries(self) -> dict[str, dict[str, tuple[int, dict[str, int]]]]:
        """{exporter: {signal: (items sent, {reason: items lost})}} over every pipeline, for each exporter
        in use: spans and log records one each, metrics one per collection (the sending queues' own
        counts: the same losses as otel_ebpf.events.dropped / otel_ebpf.metrics.dropped{exporter})."""
        out: dict[str, dict[str, tuple[int, dict[str, int]]]] = {}
        for p in self.pipelines:
            for name, sig, sent, lost in p.emitter.deliveries():
                prev_sent, prev_lost = out.setdefault(name, {}).get(sig, (0, {}))
                merged = dict(prev_lost)
                for reason, n in lost.items():
                    merged[reason] = merged.get(reason, 0) + n
                out[name][sig] = (prev_sent + sent, merged)
        return out

    def summary(self) -> dict[str, int]:
        """The run's counts; ``dropped`` is data lost, ``not_recorded`` what a limit left unrecorded (not lost)."""
        tel = self.ctx.telemetry
        return {"events": tel.get("otel_ebpf.events.received"),
                "dropped": sum(self.drops().values()), "not_recorded": sum(self.drops(lost=False).values()),
                "spans": sum(p.emitter.spans_emitted for p in self.pipelines),
                "logs": sum(p.emitter.logs_emitted for p in self.pipelines),
                "probes": tel.get("otel_ebpf.probes.attached"),
                "probe_failures": tel.get("otel_ebpf.probes.failed")}


def _quietly(fn: Callable[[], None], what: str) -> None:
    try:
        fn()
    except OtelEbpfError as exc:
        log.warning("%s: %s", what, exc)
    except Exception:
        log.exception("%s failed to stop cleanly", what)


def wait_child(pid: int, on_signal: Callable[[int], None]) -> int:
    """Wait for ``pid`` while forwarding SIGTERM/SIGHUP to it; Ctrl+C reaches it through the
    terminal. A second Ctrl+C stops waiting (the command goes on untraced). Returns the
    shell-style exit code.

    The kernel may hand a signal sent to the agent to any of its threads, and Python runs the handler only
    on the main thread, once that thread runs bytecode: a main thread blocked in ``waitpid`` never saw a
    SIGTERM taken by a compile thread, so the command was not told and the run never ended (CI, stop 32).
    The main thread therefore waits on the child's pidfd and on a ``signal.set_wakeup_fd`` pipe, which the
    C-level handler writes on whichever thread took the signal."""
    import select

    interrupts = 0

    def handler(signum: int, _frame: Any) -> None:
        nonlocal interrupts
        on_signal(signum)
        if signum == signal.SIGINT:
            interrupts += 1
            if interrupts >= 2:
                raise KeyboardInterrupt
        else:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # no pidfd (Linux < 5.3): the wakeup pipe and a bounded wait still see every signal
        pidfd = -1
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return exit_status(status)
            # the handlers run when select returns (or inside it, for a signal the main thread took)
            select.select([fd for fd in (pidfd, wake_r) if fd >= 0], [], [], _WAIT_SLICE_S)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
    except KeyboardInterrupt:
        return 130
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old.items():
            signal.signal(s, h)
        for fd in (pidfd, wake_r, wake_w):
            if fd >= 0:
                os.close(fd)


def wait_pids(pids: Sequence[int], stop: threading.Event) -> None:
    """Until ``stop`` is set (SIGINT/SIGTERM) or every target process has exited."""
    while not stop.wait(0.5):
        if not any(_alive(p) for p in pids):
            return


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its parent, is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
