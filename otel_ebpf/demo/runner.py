"""``otel-ebpf demo``: a real PyTorch training job on simulated GPUs across namespace "nodes", traced end to end.

::

    gateway (root namespace, collective_join) -> DIR/traces.jsonl, metrics.jsonl [+ OTLP]
       ^ OTLP                                    ^ OTLP
    node-0 (netns + UTS, host name node-0)       node-1 ...
      otel-ebpf run -- torchrun ... train.py     (the twin's torch 2.11 CUDA wheel, stand-in libcudart/libnccl)

The job is :mod:`.train` (FSDP2 + tensor parallel on a (dp, tp) DeviceMesh), run by
:func:`otel_ebpf.twin.cluster.run_cluster`: one agent per node, one gateway joining every collective of every
communicator across the nodes. Real PyTorch, simulated GPUs: kernels do nothing (the loss is meaningless) and
all timing is host timing; every collective torch issues is real and moves real data. The closing report
(:mod:`.summary`) is read back from the gateway's files and the job's record of its groups.

Every wait is bounded (the job's deadline, train.py's process-group timeout, the cluster's kill-on-bad-exit);
namespaces, processes and staging files are removed in ``finally``. Exit codes (returned, or raised as
OtelEbpfError): 0 the job ran as asked, an injected crash included (that is reported, not an error); 1 a node,
agent, rank or the gateway failed (named); 2 bad options; 3 the host cannot run the demo; 130 interrupted.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from otel_ebpf.core.errors import ConfigError, OtelEbpfError
from otel_ebpf.demo import summary
from otel_ebpf.demo.hangs import read_hangs
from otel_ebpf.twin.cluster import ClusterRun, ClusterSpec, run_cluster
from otel_ebpf.twin.nodes import MAX_NODES

__all__ = ["DemoOptions", "run"]

TRAIN = Path(__file__).resolve().parent / "train.py"
JOIN_TIMEOUT, DESYNC_TIMEOUT = "5s", "2s"
PG_TIMEOUT_S = 15.0  # train.py's process-group timeout: a step waiting this long for a dead peer aborts
PROGRESS_S = 2.0
_STEP = re.compile(r"oe-demo step rank=(\d+) step=(\d+)")


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
        for flag, value, low, high in (("--nodes", self.nodes, 1, MAX_NODES),
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
        return 240.0 + self.steps * (1.0 + 2 * self.straggler_delay_ms / 1000)

    def train_args(self) -> list[str]:
        """train.py's options (-1: none)."""
        def n(v: int | None) -> str:
            return str(-1 if v is None else v)

        return ["--steps", str(self.steps), "--straggler", n(self.straggler_rank),
                "--straggler-delay-ms", f"{self.straggler_delay_ms:g}", "--straggler-cause", self.straggler_cause,
                "--kill-rank", n(self.kill_rank), "--kill-after-step", n(self.kill_after_step),
                "--timeout-s", f"{PG_TIMEOUT_S:g}"]


class _Progress:
    """Each rank's last finished step, from the ranks' ``oe-demo step`` lines; a line of progress at most
    every PROGRESS_S. Called from run_cluster's thread only."""

    def __init__(self, o: DemoOptions, echo: Callable[[str], None], started: float) -> None:
        self.o, self.echo, self.started = o, echo, started
        self.steps: dict[int, int] = {}
        self.last = time.monotonic()

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:5.1f}s"

    def __call__(self, node: int, line: str) -> None:
        found = _STEP.findall(line)  # ranks share a pipe: search, do not match at the start
        for rank, step in found:
            self.steps[int(rank)] = int(step)
        if found and time.monotonic() - self.last >= PROGRESS_S:
            self.last = time.monotonic()
            r, parts = self.o.ranks_per_node, []
            for i in range(self.o.nodes):
                done = [self.steps.get(g, 0) for g in range(i * r, i * r + r)]
                parts.append(f"node-{i} {min(done)}/{self.o.steps}")
            self.echo(f"{self.elapsed()}  steps done: " + ", ".join(parts))


def _problems(o: DemoOptions, run: ClusterRun) -> list[str]:
    """What went wrong (empty: the job ran as asked). With an injected crash every node's torchrun fails (the
    killed rank's, then the others when train.py's timeout or the cluster stops them): that is the demo."""
    out = list(run.problems)
    if run.timed_out:
        out.append(f"the job did not finish in {o.deadline_s():.0f}s (logs in {run.logs})")
    elif o.kill_rank is None:
        out += [f"node-{i}: torchrun exited with code {c} (see {run.logs}/node-{i}.log)"
                for i, c in run.returncodes.items() if c != 0]
    return out


def write_collector_config(out: Path) -> None:
    """A Collector config that replays the traces into Jaeger (OTLP on 127.0.0.1:4317)."""
    path = out / "otelcol-jaeger.yaml"
    path.write_text(
        "# Replays the demo's traces into Jaeger:  otelcol-contrib --config " + str(path) + "\n"
        "# Jaeger all-in-one (OTLP on): docker run --rm -p 127.0.0.1:16686:16686 -p 127.0.0.1:4317:4317 "
        "jaegertracing/all-in-one\n"
        + yaml.safe_dump({"receivers": {"otlpjsonfile": {"include": [str(out / "traces.jsonl")],
                                                         "start_at": "beginning"}},
                          "exporters": {"otlp": {"endpoint": "127.0.0.1:4317", "tls": {"insecure": True}}},
                          "service": {"pipelines": {"traces": {"receivers": ["otlpjsonfile"],
                                                               "exporters": ["otlp"]}}}}, sort_keys=False))


def _banner(o: DemoOptions) -> str:
    straggler = "none" if o.straggler_rank is None else f"rank {o.straggler_rank} (+{o.straggler_delay_ms:g} ms " \
                                                       f"of {o.straggler_cause} before each step)"
    kill = f"; rank {o.kill_rank} crashes (SIGKILL) after step {o.kill_after_step}" if o.kill_rank is not None else ""
    return (f"otel-ebpf demo: {o.nodes} nodes x {o.ranks_per_node} ranks, {o.steps} steps of FSDP2 + tensor "
            f"parallel; straggler {straggler}{kill}\n"
            "  real PyTorch (torch 2.11 CUDA wheel), simulated GPUs: kernels do nothing (the loss is meaningless), "
            "timing is host timing; every collective is real and moves real data")


def run(opts: DemoOptions, echo: Callable[[str], None] | None = None) -> int:
    """Run the demo; returns 0 or 130 (interrupted), raises OtelEbpfError (ConfigError,
    EnvironmentError_) otherwise, after printing the summary when there is one."""
    say = echo or (lambda s: print(s, flush=True))
    opts.validate()
    say(_banner(opts))
    out = Path(opts.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("comms-rank*.json"):
        stale.unlink()
    spec = ClusterSpec(TRAIN, opts.train_args(), nodes=opts.nodes, gpus_per_node=opts.ranks_per_node, output=out,
                       env={"OTEL_EBPF_DEMO_DIR": str(out)}, join_timeout=JOIN_TIMEOUT,
                       desync_timeout=DESYNC_TIMEOUT, otlp_endpoint=opts.otlp_endpoint, timeout=opts.deadline_s(),
                       service_name="otel-ebpf-demo", bad_exit_grace=PG_TIMEOUT_S + 10)
    progress = _Progress(opts, say, time.monotonic())
    try:
        result = run_cluster(spec, say, progress)
    except KeyboardInterrupt:
        say("interrupted: every node was stopped and cleaned up")
        return 130
    say(f"{progress.elapsed()}  the job ended (torchrun exit codes: "
        + ", ".join(f"node-{i} {c}" for i, c in result.returncodes.items()) + "); the gateway flushed")
    problems = _problems(opts, result)
    write_collector_config(out)
    found = summary.read(result.traces)
    say("summary:\n" + summary.render(found, straggler=opts.straggler_rank, killed=opts.kill_rank, out_dir=out,
                                      report=summary.html_report(out), comms=summary.read_comms(out),
                                      hangs=read_hangs(result.traces.with_name("logs.jsonl"))))
    if not found.collectives:
        problems.append(f"the gateway joined no collective (logs in {result.logs})")
    if problems:
        raise OtelEbpfError("the demo failed:\n  " + "\n  ".join(problems))
    return 0
