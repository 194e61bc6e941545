"""``otel-ebpf twin``: any torchrun-style program on M namespace nodes x G simulated GPUs, traced.

::

    otel-ebpf twin --nodes M --gpus-per-node G [--output DIR] [--otlp-endpoint URL] [--no-trace] [--timeout S]
                   -- script.py [args]

Runs the program with :func:`otel_ebpf.twin.cluster.run_cluster` (the twin's real torch 2.11 CUDA wheel on the
stand-in libraries, one ``otel-ebpf run`` agent per node, one gateway joining collectives), streams the nodes'
output (the agents' own log lines go to DIR/logs only), then prints a short summary read back from the
gateway's files: collectives joined per communicator, what the agents could not join
(``otel_ebpf.nccl.unjoined``), where the files are. Lives beside the demo because it reads the gateway's files
with the demo's summary module.

Returns the job's exit code: 0 when every node's torchrun exited 0, 1 when a rank failed or the job timed out;
raises ConfigError (exit 2: no such script, bad numbers) or EnvironmentError_ (exit 3: not root, no BPF, no twin
environment: its message names the set-up command).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.core.errors import ConfigError
from otel_ebpf.demo import summary
from otel_ebpf.twin.cluster import ClusterRun, ClusterSpec, run_cluster
from otel_ebpf.twin.env import TORCH_VERSION
from otel_ebpf.twin.nodes import MAX_NODES

__all__ = ["TwinOptions", "run"]

LIMITS = (f"real PyTorch {TORCH_VERSION} (CUDA wheel) on simulated GPUs: kernels do nothing (computed values are "
          "meaningless), no Triton/torch.compile codegen, timing is host timing; collectives move real data")


@dataclass(frozen=True)
class TwinOptions:
    """The ``otel-ebpf twin`` flags."""

    command: Sequence[str]
    nodes: int = 2
    gpus_per_node: int = 2
    output: str = "./otel-ebpf-twin-out"
    otlp_endpoint: str | None = None
    traced: bool = True
    timeout: float = 600.0

    def spec(self) -> ClusterSpec:
        """The cluster to run; raises ConfigError naming the flag."""
        if not self.command:
            raise ConfigError("command", "give the program after '--': otel-ebpf twin -- train.py [args]")
        script = Path(self.command[0])
        if not script.is_file():
            raise ConfigError("command", f"no such script: {script}")
        for flag, value, high in (("--nodes", self.nodes, MAX_NODES), ("--gpus-per-node", self.gpus_per_node, 16)):
            if not 1 <= value <= high:
                raise ConfigError(flag, f"must be between 1 and {high}, got {value}")
        if not 1 <= self.timeout <= 86_400:
            raise ConfigError("--timeout", f"must be between 1 and 86400 seconds, got {self.timeout:g}")
        return ClusterSpec(script, tuple(self.command[1:]), nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                           output=Path(self.output), traced=self.traced, otlp_endpoint=self.otlp_endpoint,
                           timeout=self.timeout)


def unjoined(metrics: Path) -> dict[str, int]:
    """``otel_ebpf.nccl.unjoined`` by reason, summed over the agents (each one's last cumulative value)."""
    from otel_ebpf.report.otlpfiles import read_otlp_json

    if not metrics.exists():
        return {}
    last: dict[tuple[str, str], float] = {}
    for m in read_otlp_json(metrics).metrics:
        if m.name != "otel_ebpf.nccl.unjoined" or m.value is None:
            continue
        key = (repr(sorted(m.resource.items())), str(m.attributes.get("reason", "?")))
        last[key] = last.get(key, 0.0) + m.value if m.temporality == "delta" else max(last.get(key, 0.0), m.value)
    out: dict[str, int] = {}
    for (_agent, reason), value in last.items():
        out[reason] = out.get(reason, 0) + int(value)
    return out


def render(result: ClusterRun, traced: bool) -> str:
    """The closing summary."""
    codes = ", ".join(f"node-{i} {c}" for i, c in result.returncodes.items())
    lines = [f"job: torchrun exit codes {codes} in {result.seconds:.1f}s" + (" (timed out)" if result.timed_out
                                                                             else "")]
    lines += [f"problem: {p}" for p in result.problems]
    if traced:
        s = summary.read(result.traces)
        lines.append(f"collectives joined: {len(s.collectives)} ({len(s.complete)} complete, {len(s.partial)} "
                     f"partial) + {len(s.p2p)} grouped send/recv, from {len(s.rank_hosts)} ranks")
        for row in s.communicators():
            ranks = ",".join("?" if g is None else str(g) for g in row.ranks) or "?"
            ops = ", ".join(f"{op} {n}" for op, n in row.ops)
            lines.append(f"  comm {row.comm[:8]} ranks {ranks} (size {row.size}): {row.complete} complete, "
                         f"{row.partial} partial: {ops}")
        missed = unjoined(result.metrics)
        lines.append("unjoined (otel_ebpf.nccl.unjoined): " + (", ".join(f"{r} {n}" for r, n in sorted(missed.items()))
                                                               or "0"))
        lines.append(f"files: {result.traces}, {result.metrics}, logs in {result.logs}")
    else:
        lines.append(f"untraced (--no-trace); logs in {result.logs}")
    return "\n  ".join(lines)


def run(opts: TwinOptions, echo: Callable[[str], None] | None = None) -> int:
    """Run the program (see the module doc); returns the job's exit code."""
    say = echo or (lambda s: print(s, flush=True))
    spec = opts.spec()
    say(f"otel-ebpf twin: {opts.nodes} nodes x {opts.gpus_per_node} GPUs (ranks 0-{opts.nodes * opts.gpus_per_node - 1}"
        f"), {'traced' if opts.traced else 'untraced'}: torchrun {' '.join(opts.command)}\n  {LIMITS}")

    def line(node: int, text: str) -> None:
        if not text.startswith("otel-ebpf "):  # the agent's own log lines: in logs/node-<i>.log
            say(f"[node-{node}] {text}")

    result = run_cluster(spec, say, line)
    say("summary:\n  " + render(result, opts.traced))
    failed = result.timed_out or bool(result.problems) or any(c != 0 for c in result.returncodes.values())
    return 1 if failed else 0
