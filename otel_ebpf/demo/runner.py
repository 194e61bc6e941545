"""``otel-ebpf demo``: a simulated multi-node data-parallel job on one machine, traced end to end.

::

    gateway (root namespace; one OTLP/gRPC receiver on each node's 10.213.i.1) -> DIR/*.jsonl [+ OTLP]
       ^ OTLP                                   ^ OTLP
    node-0: netns oe-demo-R-0, host name node-0  node-1: ...
      otel-ebpf run -- worker launcher -> ranks 0..R-1 (real libcudart + stand-in libnccl)

Each node is a network namespace plus its own UTS namespace (:mod:`.netns`), so its agent's
``host.name`` is ``node-<i>``; the agent traces that node's ranks (:mod:`.worker`) and exports to
the gateway over the node's veth. The gateway joins every collective across nodes; the
closing report (:mod:`.summary`) is read back from its files.

Every wait is bounded; ``run`` removes namespaces, veths, processes and its temporary
directory in ``finally`` (also on Ctrl+C or an error), and first removes what dead runs left.
Exit codes (returned, or raised as OtelEbpfError): 0 the job ran as asked, an injected crash
included (that is reported, not an error); 1 a node, agent, rank or the gateway failed
(named); 2 bad options; 3 the host cannot run the demo; 130 interrupted.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from otel_ebpf.demo import netns, summary, worker
from otel_ebpf.demo.procs import Child
from otel_ebpf.demo.build import build_stand_in_nccl, find_cudart
from otel_ebpf.core.errors import ConfigError, EnvironmentError_, OtelEbpfError

__all__ = ["DemoOptions", "run"]

GATEWAY_START_S = 30.0
STOP_S = 40.0  # an agent detaching ~100 uprobes takes 10-20 s (BCC removes them one by one)
JOIN_TIMEOUT, DESYNC_TIMEOUT = "5s", "2s"  # desync must come well inside worker.WATCHDOG_S
PROGRESS_S = 2.0
_CHILD_ENV_DROP = "OTEL_EBPF_"  # the user's agent settings must not leak into the demo's processes


@dataclass
class DemoOptions:
    """The ``otel-ebpf demo`` flags. ``straggler`` None: the last rank; -1: none."""

    nodes: int = 2
    ranks_per_node: int = 2
    steps: int = 20
    straggler: int | None = None
    straggler_delay_ms: float = 30.0
    straggler_cause: str = "cpu"  # cpu: a longer compute phase (busy); sleep: blocked
    kill_rank: int | None = None
    kill_after_step: int | None = None
    output: str = "./otel-ebpf-demo-out"
    otlp_endpoint: str | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def straggler_rank(self) -> int | None:
        if self.straggler is None:
            return self.world - 1
        return None if self.straggler < 0 else self.straggler

    def validate(self) -> None:
        """Raises ConfigError naming the flag."""
        for flag, value, low, high in (("--nodes", self.nodes, 1, netns.MAX_NODES),
                                       ("--ranks-per-node", self.ranks_per_node, 1, 16),
                                       ("--steps", self.steps, 1, 100_000)):
            if not low <= value <= high:
                raise ConfigError(flag, f"must be between {low} and {high}, got {value}")
        if self.straggler is not None and not -1 <= self.straggler < self.world:
            raise ConfigError("--straggler", f"must be a rank 0..{self.world - 1} or -1, got {self.straggler}")
        if not 0 <= self.straggler_delay_ms <= 10_000:
            raise ConfigError("--straggler-delay-ms", "must be between 0 and 10000")
        if (self.kill_rank is None) != (self.kill_after_step is None):
            raise ConfigError("--kill-rank", "give --kill-rank and --kill-after-step together")
        if self.kill_rank is not None and not 0 <= self.kill_rank < self.world:
            raise ConfigError("--kill-rank", f"must be a rank 0..{self.world - 1}, got {self.kill_rank}")
        if self.kill_after_step is not None and not 1 <= self.kill_after_step < self.steps:
            raise ConfigError("--kill-after-step", f"must be 1..{self.steps - 1} (a step must follow it)")

    def deadline_s(self) -> float:
        """The longest the whole job may take (agents' start and stop included)."""
        return 240.0 + self.steps * (0.2 + 2 * self.straggler_delay_ms / 1000)


def _kill_orphans(run_dir: Path) -> None:
    """SIGKILL what a dead run left running (its gateway, agents, ranks: their command lines
    name its directory)."""
    needle = str(run_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o600)  # configs must not be world-writable (the agent refuses them)
    return path


def _preflight() -> Path:
    """The CUDA runtime's path; raises EnvironmentError_ for what the host lacks."""
    from otel_ebpf.bpf.loader import require_bpf

    require_bpf()
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            raise EnvironmentError_(f"the demo needs '{tool}'", hint=f"install {package}")
    cudart = find_cudart()
    if cudart is None:
        raise EnvironmentError_("the demo's ranks drive NVIDIA's CUDA runtime, and nvidia-cuda-runtime-cu12 is "
                                "not installed for this Python",
                                hint="pip install 'otel-ebpf[demo]' (or nvidia-cuda-runtime-cu12)")
    return cudart


class _Demo:
    """One run: see the module doc. ``echo`` prints one line of progress."""

    def __init__(self, opts: DemoOptions, echo: Callable[[str], None]) -> None:
        self.o, self.echo = opts, echo
        self.out = Path(opts.output).resolve()
        self.run_id = netns.run_id()
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"oe-demo-{self.run_id}-"))
        self.logs = self.out / "logs"
        self.nodes: list[netns.NodeNet] = []
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.gateway: Child | None = None
        self.agents: list[Child] = []
        self.ports: dict[int, int] = {}
        self.steps: dict[int, int] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(_CHILD_ENV_DROP)}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.hurry = threading.Event()
        self.started = time.monotonic()

    # ---- set-up ------------------------------------------------------------------------
    def prepare(self) -> tuple[Path, Path]:
        cudart = _preflight()
        removed = netns.remove_stale()  # first: it refuses to run beside another demo
        for old in Path(tempfile.gettempdir()).glob("oe-demo-*-*"):  # dead runs' directories
            run = old.name.split("-")[2]
            if run != self.run_id and not netns.run_alive(run):
                _kill_orphans(old)
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old.name)
        if removed:
            self.echo(f"removed leftovers of earlier runs: {', '.join(removed)}")
        nccl = build_stand_in_nccl(self.run_dir / "lib")
        self.logs.mkdir(parents=True, exist_ok=True)
        for stale in (self.out / "traces.jsonl", self.out / "metrics.jsonl", *self.logs.glob("*.log")):
            stale.unlink(missing_ok=True)  # the file exporter appends: start from empty files
        return cudart, nccl

    def start_gateway(self) -> None:
        receivers = {f"otlp/node{n.index}": {"grpc_endpoint": f"{n.host_addr}:0", "http_endpoint": ""}
                     for n in self.nodes}
        # One receiver per node, each bound to that node's host-side veth address: the gateway
        # listens on exactly the addresses the nodes can reach and on nothing else (no 0.0.0.0,
        # no routes between nodes). Port 0: free ports, read back from the gateway's first line.
        cfg = _write_yaml(self.run_dir / "gateway.yaml", {
            "receivers": receivers,
            "processors": {"collective_join": {"timeout": JOIN_TIMEOUT, "desync_timeout": DESYNC_TIMEOUT}},
            "exporters": {"file": {"batch": {"batch_delay": "200ms"}}},
            "service": {"metrics_interval": "2s", "pipelines": {"default": {
                "receivers": list(receivers), "processors": ["collective_join"], "exporters": ["file"]}}}})
        argv = [sys.executable, "-m", "otel_ebpf", "--log-level", "warning", "gateway", "--config", str(cfg),
                "--output", str(self.out)]
        if self.o.otlp_endpoint:
            argv += ["--otlp-endpoint", self.o.otlp_endpoint]
        self.gateway = Child("gateway", argv, self.logs / "gateway.log", self.lines, self.env)
        deadline = time.monotonic() + GATEWAY_START_S
        while time.monotonic() < deadline:
            try:
                name, line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if name == "gateway" and line and "listening" in line:
                found = re.findall(r"otlp/node(\d+) grpc=(\d+)", line)
                self.ports = {int(i): int(p) for i, p in found}
                break
            if name == "gateway" and line is None:
                break
        if len(self.ports) != len(self.nodes):
            raise OtelEbpfError(f"the gateway did not start (see {self.gateway.log}):{self.gateway.tail()}")
        self.echo("gateway listening on " + ", ".join(f"{n.host_addr}:{self.ports[n.index]}" for n in self.nodes)
                  + f"; joined traces -> {self.out}/traces.jsonl")

    def start_agents(self, cudart: Path, nccl: Path) -> None:
        cfg = _write_yaml(self.run_dir / "agent.yaml", {
            "receivers": {"cuda": {"libraries": [str(cudart)]}, "nccl": {"libraries": [str(nccl)]}},
            "exporters": {"otlp": {"batch": {"batch_delay": "200ms"}}},
            # sched: each rank's off-CPU/run-queue time between collectives (ml.step.*), which the
            # gateway copies onto the straggler's joined collective: why it was late.
            "service": {"pipelines": {"default": {"receivers": ["cuda", "nccl", "sched"],
                                                  "processors": ["cuda", "nccl", "sched"]}}}})
        o = self.o
        for n in self.nodes:
            # The agent is told exactly which libraries the ranks load (config above), and the
            # launcher starts through env(1) so that the agent does not also probe every library
            # of the Python environment (python_env_libraries looks at a Python command[0]): with
            # nvidia-nccl-cu12 installed that is NVIDIA's libnccl, 58 uprobes no rank ever hits,
            # each costing ~0.15 s to detach at the end (kernel 6.18, BCC 0.26: one at a time).
            job = ["env", "PYTHONUNBUFFERED=1", sys.executable, "-m", "otel_ebpf.demo.worker",
                   "--node", str(n.index), "--nodes", str(o.nodes),
                   "--ranks", str(o.ranks_per_node), "--steps", str(o.steps), "--run-dir", str(self.run_dir),
                   "--nccl", str(nccl), "--straggler", str(_or(o.straggler_rank)),
                   "--straggler-delay-ms", str(o.straggler_delay_ms), "--straggler-cause", o.straggler_cause,
                   "--kill-rank", str(_or(o.kill_rank)),
                   "--kill-after-step", str(_or(o.kill_after_step)), "--master-addr", self.nodes[0].node_addr,
                   "--deadline-s", str(o.deadline_s())]
            agent = [sys.executable, "-m", "otel_ebpf", "--log-level", "warning", "run", "--config", str(cfg),
                     "--otlp-endpoint", f"http://{n.host_addr}:{self.ports[n.index]}",
                     "--service-name", "otel-ebpf-demo", "--", *job]
            self.agents.append(Child(f"node-{n.index}", n.enter(agent), self.logs / f"node-{n.index}.log",
                                      self.lines, self.env))

    # ---- the run -----------------------------------------------------------------------
    def _line(self, name: str, line: str, up: set[int]) -> None:
        m = re.match(r"oe-demo step rank=(\d+) step=(\d+)", line)
        if m:
            self.steps[int(m.group(1))] = int(m.group(2))
            return
        m = re.match(r"oe-demo up node=(\d+) host=(\S+)", line)
        if m:
            i, host = int(m.group(1)), m.group(2)
            n, r = self.nodes[i], self.o.ranks_per_node
            up.add(i)
            if host != n.hostname:
                self.echo(f"{name}: warning: the agent sees host name {host!r}, not {n.hostname!r}")
            self.echo(f"{name}: agent up in netns {n.netns} (host.name {host}, {n.node_addr} -> gateway "
                      f"{n.host_addr}:{self.ports[i]}); ranks {i * r}-{i * r + r - 1} starting")

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:5.1f}s"

    def _progress(self) -> str:
        r, parts = self.o.ranks_per_node, []
        for n in self.nodes:
            done = [self.steps.get(g, 0) for g in range(n.index * r, n.index * r + r)]
            parts.append(f"{n.hostname} {min(done)}/{self.o.steps}")
        return f"{self.elapsed()}  steps done: " + ", ".join(parts)

    def watch(self) -> None:
        """Until every agent exited; raises OtelEbpfError when a node or the gateway fails early."""
        up: set[int] = set()
        deadline = self.started + self.o.deadline_s()
        last = time.monotonic()
        job_done = False
        while any(a.running() for a in self.agents):
            try:
                name, line = self.lines.get(timeout=0.2)
                if line is not None:
                    self._line(name, line, up)
            except queue.Empty:
                pass
            for i, a in enumerate(self.agents):
                if i not in up and not a.running():
                    raise OtelEbpfError(f"node-{i}: the agent exited with code {a.proc.returncode} before "
                                        f"starting the job (see {a.log}):{a.tail()}")
            if self.gateway is not None and not self.gateway.running():
                raise OtelEbpfError(f"the gateway exited early with code {self.gateway.proc.returncode} "
                                    f"(see {self.gateway.log}):{self.gateway.tail()}")
            if not job_done and all((self.run_dir / f"node-{n.index}.status.json").exists() for n in self.nodes):
                job_done = True
                self.echo(f"{self.elapsed()}  every rank exited; the agents detach their probes and flush "
                          "(detaching takes ~0.15 s per uprobe: tens of seconds)")
            elif up and time.monotonic() - last >= PROGRESS_S and not job_done:
                last = time.monotonic()
                self.echo(self._progress())
            if time.monotonic() > deadline:
                raise OtelEbpfError(f"the job did not finish in {self.o.deadline_s():.0f}s (logs in {self.logs})")

    def _expected(self, rank: int) -> set[int]:
        if self.o.kill_rank is None:
            return {0}
        return {-signal.SIGKILL} if rank == self.o.kill_rank else {0, worker.WATCHDOG_EXIT}

    def problems(self) -> list[str]:
        """What went wrong on the nodes (empty: each ran as asked)."""
        out = []
        for n, a in zip(self.nodes, self.agents, strict=True):
            try:
                codes = {int(k): v for k, v in json.loads((self.run_dir / f"node-{n.index}.status.json")
                                                          .read_text())["ranks"].items()}
            except (OSError, ValueError, KeyError):
                out.append(f"{n.hostname}: the agent exited with code {a.proc.returncode} before its ranks "
                           f"finished (see {a.log}):{a.tail()}")
                continue
            bad = {g: c for g, c in codes.items() if c not in self._expected(g)}
            for g, c in bad.items():
                out.append(f"{n.hostname}: rank {g} exited with code {c} (see {a.log}):{a.tail()}")
            want = 0 if all(c == 0 for c in codes.values()) else worker.RANKS_FAILED
            if not bad and a.proc.returncode != want:
                out.append(f"{n.hostname}: the agent exited with code {a.proc.returncode} (see {a.log}):{a.tail()}")
        return out

    def stop_gateway(self) -> list[str]:
        """Stop the gateway (SIGTERM: it releases what is pending and flushes its exporters)."""
        if self.gateway is None:
            return []
        rc = self.gateway.stop(STOP_S, self.hurry)
        return [] if rc == 0 else [f"the gateway exited with code {rc} (see {self.gateway.log}):{self.gateway.tail()}"]

    def cleanup(self) -> None:
        """Stop everything still running, remove namespaces and the run directory. Never raises;
        Ctrl+C while it waits for the agents kills them at once."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, lambda *_: self.hurry.set()) if main else None
        try:
            for a in self.agents:  # in parallel: each SIGTERMed agent detaches its probes
                a.terminate()
            for a in self.agents:
                a.stop(STOP_S, self.hurry)
            if self.gateway is not None:
                self.gateway.stop(STOP_S, self.hurry)
            left = netns.destroy(self.nodes)
            if left:
                self.echo(f"could not remove network namespaces {', '.join(left)}: 'ip netns del' them")
            shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)

    def write_collector_config(self) -> None:
        """A Collector config that replays the traces into Jaeger (OTLP on 127.0.0.1:4317)."""
        path = self.out / "otelcol-jaeger.yaml"
        path.write_text(
            "# Replays the demo's traces into Jaeger:  otelcol-contrib --config " + str(path) + "\n"
            "# Jaeger all-in-one (OTLP on): docker run --rm -p 127.0.0.1:16686:16686 -p 127.0.0.1:4317:4317 "
            "jaegertracing/all-in-one\n"
            + yaml.safe_dump({"receivers": {"otlpjsonfile": {"include": [str(self.out / "traces.jsonl")],
                                                             "start_at": "beginning"}},
                              "exporters": {"otlp": {"endpoint": "127.0.0.1:4317", "tls": {"insecure": True}}},
                              "service": {"pipelines": {"traces": {"receivers": ["otlpjsonfile"],
                                                                   "exporters": ["otlp"]}}}}, sort_keys=False))


def _or(value: int | None) -> int:
    return -1 if value is None else value


def _banner(o: DemoOptions) -> str:
    straggler = "none" if o.straggler_rank is None else f"rank {o.straggler_rank} (+{o.straggler_delay_ms:g} ms " \
                                                       f"of {o.straggler_cause} before each collective)"
    kill = f"; rank {o.kill_rank} crashes (SIGKILL) after step {o.kill_after_step}" if o.kill_rank is not None else ""
    return (f"otel-ebpf demo: {o.nodes} nodes x {o.ranks_per_node} ranks, {o.steps} steps; straggler {straggler}"
            f"{kill}")


def run(opts: DemoOptions, echo: Callable[[str], None] | None = None) -> int:
    """Run the demo; returns 0 or 130 (interrupted), raises OtelEbpfError (ConfigError,
    EnvironmentError_) otherwise, after printing the summary when there is one."""
    say = echo or (lambda s: print(s, flush=True))
    opts.validate()
    say(_banner(opts))
    demo = _Demo(opts, say)
    try:
        cudart, nccl = demo.prepare()
        demo.nodes = netns.create(demo.run_id, opts.nodes)
        demo.start_gateway()
        demo.start_agents(cudart, nccl)
        demo.watch()
        say(f"{demo.elapsed()}  agents stopped; stopping the gateway (it flushes the joined traces)")
        problems = demo.problems() + demo.stop_gateway()
    except KeyboardInterrupt:
        say("interrupted: stopping every node; the agents detach their probes first (Ctrl+C again: kill them)")
        return 130
    finally:
        demo.cleanup()
    demo.write_collector_config()
    result = summary.read(demo.out / "traces.jsonl")
    say("summary:\n" + summary.render(result, straggler=opts.straggler_rank, killed=opts.kill_rank, out_dir=demo.out,
                                      report=summary.html_report(demo.out)))
    if not result.collectives:
        problems.append(f"the gateway joined no collective (logs in {demo.logs})")
    if problems:
        raise OtelEbpfError("the demo failed:\n  " + "\n  ".join(problems))
    return 0
