"""M namespace nodes x G simulated GPUs running one torchrun-style program on the twin, traced end to end.

::

    gateway (root namespace, collective_join) on the switch's 10.213.(128+k).1
      -> OUT/traces.jsonl, metrics.jsonl, logs.jsonl
       ^ OTLP                                         ^ OTLP
    node-0 (netns + UTS, host name node-0)            node-1 ...
      otel-ebpf run -- torchrun --nnodes M --node-rank 0 --nproc-per-node G --master-addr <node-0> script args
        ranks 0..G-1: the twin's real torch on the stand-in libcudart/libnccl

Every node (:mod:`.nodes`) reaches every other one over a private bridge, so torchrun's static TCP
rendezvous (node-0 hosts the store) and the program's own sockets work as on a cluster; the stand-in NCCL's
ranks meet in shared memory under one ``OTEL_EBPF_TWIN_DIR`` (/dev/shm is shared across network
namespaces). Each node's agent traces the cuda, nccl and sched receivers (with their processors, and nccl_watch:
a rank silent in NCCL gets its live stack exported), told exactly the stand-in libraries of the twin's build, and
exports to the gateway, which joins every collective across nodes. ``RANK`` = node * G + local rank, as torchrun
sets it.

When a node's torchrun logs a failed rank or exits non-zero, the nodes still running get ``bad_exit_grace``
seconds, then are stopped (a scheduler's kill-on-bad-exit: with the static rendezvous nothing tells another
node's torchrun that its peers are gone, and in torch 2.11 a node with a failed rank can linger 300 s on the
store before it exits). At ``timeout`` everything is stopped; the agents still flush what they traced.

Blocking. Raises ``TwinSetupError``/``TwinBuildError``/``EnvironmentError_`` (not root, no BPF, no ``ip``,
no twin venv) or ``ValueError`` (a bad spec) before anything starts; a failing program is a result
(``ClusterRun.returncodes``), not an exception. Namespaces, processes and staging files are removed in
``finally``, also on Ctrl+C (a second Ctrl+C stops waiting for the agents to flush).
"""
from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from otel_ebpf.core.errors import EnvironmentError_
from otel_ebpf.twin import nodes as nodes_mod
from otel_ebpf.twin.build import build
from otel_ebpf.twin.env import TwinEnv, find_env
from otel_ebpf.twin.launch import twin_environment
from otel_ebpf.twin.procs import Child, Lines

__all__ = ["ClusterRun", "ClusterSpec", "run_cluster"]

MASTER_PORT = 29500  # torchrun's default; each node has its own network namespace, so it is always free
GATEWAY_START_S = 30.0
STOP_S = 40.0  # an agent flushing and detaching its probes
KILL_AFTER_S = 15.0
_RANK_FAILED = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+|ChildFailedError")
_UP = re.compile(r"^oe-twin up node=(\d+) host=(\S+)")
# The first line under the agent, once its probes are attached: which node and the host name it sees.
_ANNOUNCE = 'echo "oe-twin up node=$1 host=$(cat /proc/sys/kernel/hostname)"; shift; exec "$@"'


@dataclass(frozen=True)
class ClusterSpec:
    """What to run and how (immutable). See the module doc for ``bad_exit_grace``."""

    script: Path
    args: Sequence[str] = ()
    nodes: int = 2
    gpus_per_node: int = 2
    output: Path = Path("./otel-ebpf-twin-out")
    env: Mapping[str, str] = field(default_factory=dict)
    traced: bool = True
    join_timeout: str = "5s"
    desync_timeout: str = "2s"
    otlp_endpoint: str | None = None
    timeout: float = 300.0
    service_name: str = "otel-ebpf-twin"
    bad_exit_grace: float = 20.0
    nccl_receiver: Mapping[str, Any] = field(default_factory=dict)  # agents' receivers.nccl keys beside libraries


@dataclass(frozen=True)
class ClusterRun:
    """The outcome. ``returncodes``: node index -> its torchrun's exit code (-9: still running at the
    timeout). ``problems``: what failed outside the program (an agent or the gateway), empty when none."""

    returncodes: dict[int, int]
    timed_out: bool
    seconds: float
    traces: Path
    metrics: Path
    logs: Path
    problems: tuple[str, ...] = ()


def _preflight(traced: bool) -> None:
    if os.geteuid() != 0:
        raise EnvironmentError_("namespace nodes need root (network and UTS namespaces; the agents' BPF)",
                                hint="run it with sudo")
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            raise EnvironmentError_(f"namespace nodes need '{tool}'", hint=f"install {package}")
    if traced:
        from otel_ebpf.bpf.loader import require_bpf

        require_bpf()


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o600)  # configs must not be world-writable (the agent refuses them)
    return path


def _base_env() -> dict[str, str]:
    """The caller's environment less its otel-ebpf settings (they must not leak into the agents)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_") or k.startswith("OTEL_EBPF_TWIN_")}


class _Cluster:
    """One run; owned by the calling thread."""

    def __init__(self, spec: ClusterSpec, twin: TwinEnv, libdir: Path, echo: Callable[[str], None],
                 on_line: Callable[[int, str], None] | None) -> None:
        self.spec, self.twin, self.libdir, self.echo, self.on_line = spec, twin, libdir, echo, on_line
        self.out = spec.output.resolve()
        self.logs = self.out / "logs"
        self.lines: Lines = queue.Queue()
        self.net: nodes_mod.Nodes | None = None
        self.gateway: Child | None = None
        self.port = 0
        self.children: list[Child] = []
        self.up: set[int] = set()
        self.codes: dict[int, int] = {}
        self.problems: list[str] = []
        self.hurry = threading.Event()
        self.killed = False
        self.failed_at: float | None = None  # when a node first reported a failed rank (or exited non-zero)
        self.staging = Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp") / "otel-ebpf-twin-nodes"

    def prepare(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for stale in (self.out / "traces.jsonl", self.out / "metrics.jsonl", self.out / "logs.jsonl",
                      *self.logs.glob("*.log")):
            stale.unlink(missing_ok=True)  # the file exporter appends: start from empty files
        self.net = nodes_mod.create(self.spec.nodes)
        if self.net.removed:
            self.echo(f"removed leftovers of a dead run: {', '.join(self.net.removed)}")
        self.staging = self.staging.with_name(f"{self.staging.name}-{self.net.slot}")
        shutil.rmtree(self.staging, ignore_errors=True)  # a dead run's, in our slot
        self.staging.mkdir(mode=0o700)

    def start_gateway(self) -> None:
        assert self.net is not None
        s = self.spec
        cfg = _write_yaml(self.net.run_dir / "gateway.yaml", {
            "receivers": {"otlp/nodes": {"grpc_endpoint": f"{self.net.gateway_addr}:0", "http_endpoint": ""}},
            "processors": {"collective_join": {"timeout": s.join_timeout, "desync_timeout": s.desync_timeout}},
            "service": {"metrics_interval": "2s", "pipelines": {"default": {
                "receivers": ["otlp/nodes"], "processors": ["collective_join"], "exporters": ["file"]}}}})
        argv = [sys.executable, "-m", "otel_ebpf", "--log-level", "warning", "gateway", "--config", str(cfg),
                "--output", str(self.out)]
        if s.otlp_endpoint:
            argv += ["--otlp-endpoint", s.otlp_endpoint]
        self.gateway = Child("gateway", argv, self.logs / "gateway.log", self.lines, _base_env())
        deadline = time.monotonic() + GATEWAY_START_S
        while time.monotonic() < deadline and not self.port:
            try:
                _name, line = self.lines.get(timeout=0.2)  # only the gateway runs yet
            except queue.Empty:
                continue
            if line is None:
                break
            m = re.search(r"otlp/nodes grpc=(\d+)", line)
            self.port = int(m.group(1)) if m else 0
        if not self.port:
            raise EnvironmentError_(f"the gateway did not start (see {self.gateway.log}):{self.gateway.tail()}")
        self.echo(f"gateway listening on {self.net.gateway_addr}:{self.port}; joined traces -> "
                  f"{self.out}/traces.jsonl")

    def _agent_config(self) -> Path:
        assert self.net is not None
        return _write_yaml(self.net.run_dir / "agent.yaml", {
            "receivers": {"cuda": {"libraries": [str(self.libdir / "libcudart.so.13")]},
                          "nccl": {"libraries": [str(self.libdir / "libnccl.so.2")], **self.spec.nccl_receiver}},
            # sched: each rank's off-CPU/run-queue time between collectives (ml.step.*), which the gateway
            # copies onto a straggler's joined collective: why it was late. lifecycle: a span per process of
            # the job (torchrun, its ranks, their helpers) with its command line and exit code, as sched gave
            # before issue 18 split them. nccl_watch (right after nccl, whose call spans it reads): a rank
            # silent in NCCL gets its live stack exported (issue 17).
            "service": {"pipelines": {"default": {"receivers": ["cuda", "nccl", "lifecycle", "sched"],
                                                  "processors": ["cuda", "nccl", "nccl_watch", "lifecycle",
                                                                 "sched"]}}}})

    def _twin_vars(self, index: int) -> list[str]:
        """``K=V`` for env(1): the twin's variables for this node's job only (the agent itself must not load
        the stand-ins or stubs from LD_LIBRARY_PATH)."""
        s = self.spec
        full = twin_environment(self.libdir, s.gpus_per_node, self.staging,
                                {**s.env, "OTEL_EBPF_TWIN_NODE": str(index)})
        return [f"{k}={v}" for k, v in full.items() if os.environ.get(k) != v]

    def start_nodes(self) -> None:
        assert self.net is not None
        s = self.spec
        agent_cfg = self._agent_config() if s.traced else None
        master = self.net.nodes[0].addr
        for node in self.net.nodes:
            job = [str(self.twin.python), "-m", "torch.distributed.run", f"--nnodes={s.nodes}",
                   f"--node-rank={node.index}", f"--nproc-per-node={s.gpus_per_node}", f"--master-addr={master}",
                   f"--master-port={MASTER_PORT}", str(s.script), *s.args]
            # env(1) first, so that the agent does not treat the command as a Python program and probe every
            # library of the twin's venv (it is told exactly the stand-ins above).
            argv = ["env", *self._twin_vars(node.index), "sh", "-c", _ANNOUNCE, "sh", str(node.index), *job]
            if agent_cfg is not None:
                argv = [sys.executable, "-m", "otel_ebpf", "--log-level", "warning", "run", "--quiet",
                        "--config", str(agent_cfg), "--otlp-endpoint",
                        f"http://{self.net.gateway_addr}:{self.port}", "--service-name", s.service_name,
                        "--", *argv]
            self.children.append(Child(node.hostname, node.enter(argv), self.logs / f"{node.hostname}.log",
                                       self.lines, _base_env()))

    def _line(self, name: str, line: str) -> None:
        if not name.startswith("node-"):
            return
        index = int(name[5:])
        m = _UP.match(line)
        if m:
            self.up.add(index)
            g = self.spec.gpus_per_node
            what = "agent up" if self.spec.traced else "up"
            self.echo(f"{name}: {what} (host name {m.group(2)}, {self.net.nodes[index].addr if self.net else ''}); "
                      f"ranks {index * g}-{index * g + g - 1} starting")
        else:
            if self.failed_at is None and _RANK_FAILED.search(line):
                # torchrun's log of a failed rank (torch 2.11 elastic/multiprocessing/api.py). That node can then
                # linger for minutes before it exits (shutting its rendezvous down waits on the store, 300 s).
                self.failed_at = time.monotonic()
                self.echo(f"{name}: torchrun reports a failed rank (see {self.logs}/{name}.log)")
            if self.on_line is not None:
                self.on_line(index, line)

    def _reap(self) -> None:
        """Record nodes that exited, and when the first one failed."""
        for i, c in enumerate(self.children):
            if i in self.codes or c.running():
                continue
            self.codes[i] = c.proc.returncode
            if i not in self.up and self.spec.traced:
                self.problems.append(f"node-{i}: the agent exited with code {c.proc.returncode} before the job "
                                     f"started (see {c.log}):{c.tail()}")
            elif c.proc.returncode != 0:
                self.echo(f"node-{i}: torchrun exited with code {c.proc.returncode} (see {c.log})")
                self.failed_at = self.failed_at if self.failed_at is not None else time.monotonic()

    def _kill_on_bad_exit(self, late: float) -> None:
        """``late`` seconds after the grace: SIGTERM the nodes still running; KILL_AFTER_S later, SIGKILL what
        runs under each one's agent (torchrun blocked in a store wait sees no SIGTERM), or the untraced node."""
        running = [c for c in self.children if c.running()]
        if late < 0 or not running:
            return
        if not any(c.terminated for c in running):
            names = ", ".join(c.name for c in running)
            self.echo(f"a node failed {self.spec.bad_exit_grace:g}s ago: stopping {names}")
            for c in running:
                c.terminate()
        elif late > KILL_AFTER_S and not self.killed:
            self.killed = True
            names = ", ".join(c.name for c in running)
            self.echo(f"still running {KILL_AFTER_S:g}s after SIGTERM: SIGKILL {names}")
            for c in running:
                c.kill_descendants() if self.spec.traced else c.stop(0, self.hurry)

    def watch(self, deadline: float) -> bool:
        """Until every node exited, or ``deadline`` (returns True: timed out)."""
        while len(self.codes) < len(self.children):
            try:
                name, line = self.lines.get(timeout=0.2)
                if line is not None:
                    self._line(name, line)
            except queue.Empty:
                pass
            self._reap()
            if self.failed_at is not None:
                self._kill_on_bad_exit(time.monotonic() - self.failed_at - self.spec.bad_exit_grace)
            if time.monotonic() > deadline:
                return True
        return False

    def stop_nodes(self, timed_out: bool) -> None:
        for c in self.children:  # in parallel: each SIGTERMed agent forwards it and flushes
            c.terminate()
        for i, c in enumerate(self.children):
            rc = c.stop(STOP_S, self.hurry)
            if i not in self.codes:
                self.codes[i] = -signal.SIGKILL if timed_out or rc is None else rc
        end = time.monotonic() + 5  # the readers' last lines
        while time.monotonic() < end:
            try:
                name, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                break
            if line is not None:
                self._line(name, line)

    def stop_gateway(self) -> None:
        """SIGTERM: it releases what is pending and flushes its exporters."""
        if self.gateway is not None and self.gateway.running():
            rc = self.gateway.stop(STOP_S, self.hurry)
            if rc != 0:
                self.problems.append(f"the gateway exited with code {rc} (see {self.gateway.log}):"
                                     f"{self.gateway.tail()}")
        elif self.gateway is not None:
            self.problems.append(f"the gateway exited early with code {self.gateway.proc.returncode} (see "
                                 f"{self.gateway.log}):{self.gateway.tail()}")

    def cleanup(self) -> None:
        """Stop everything still running, remove namespaces and staging files. Never raises; Ctrl+C while it
        waits for the agents kills them at once."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, lambda *_: self.hurry.set()) if main else None
        try:
            for c in self.children:
                c.terminate()
            for c in [*self.children, *([self.gateway] if self.gateway else [])]:
                c.stop(STOP_S, self.hurry)
            if self.net is not None:
                left = self.net.destroy()
                if left:
                    self.echo(f"could not remove network namespaces {', '.join(left)}: 'ip netns del' them")
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)


def _check(spec: ClusterSpec) -> None:
    if not 1 <= spec.nodes <= nodes_mod.MAX_NODES:
        raise ValueError(f"nodes must be 1..{nodes_mod.MAX_NODES}, got {spec.nodes}")
    if not 1 <= spec.gpus_per_node <= 16:
        raise ValueError(f"gpus_per_node must be 1..16, got {spec.gpus_per_node}")
    if spec.timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {spec.timeout}")
    if not Path(spec.script).is_file():
        raise ValueError(f"no such program: {spec.script}")


def run_cluster(spec: ClusterSpec, echo: Callable[[str], None] | None = None,
                on_line: Callable[[int, str], None] | None = None) -> ClusterRun:
    """Runs ``spec`` (see the module doc). ``echo`` gets one line of progress at a time; ``on_line`` gets
    (node index, line) for every line of a node's output (its agent's, torchrun's and its ranks'), from the
    calling thread."""
    _check(spec)
    say = echo or (lambda s: None)
    _preflight(spec.traced)
    twin = find_env()
    libdir = build(twin)
    spec = ClusterSpec(**{**spec.__dict__, "script": Path(spec.script).resolve()})
    c = _Cluster(spec, twin, libdir, say, on_line)
    started = time.monotonic()
    try:
        c.prepare()
        if spec.traced:
            c.start_gateway()
        c.start_nodes()
        timed_out = c.watch(started + spec.timeout)
        if timed_out:
            say(f"the job did not finish in {spec.timeout:g}s: stopping every node")
        c.stop_nodes(timed_out)
        seconds = time.monotonic() - started
        c.stop_gateway()
    finally:
        c.cleanup()
    return ClusterRun(dict(sorted(c.codes.items())), timed_out, seconds, c.out / "traces.jsonl",
                      c.out / "metrics.jsonl", c.logs, tuple(c.problems))
