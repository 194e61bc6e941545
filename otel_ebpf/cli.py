"""The ``otel-ebpf`` command line.

::

    otel-ebpf check
    otel-ebpf run [--config FILE] [--output DIR] [--otlp-endpoint URL] [--otlp-protocol grpc|http] -- CMD ...
    otel-ebpf run --pid PID [--pid PID ...] [...]
    otel-ebpf run --all-processes [...]
    otel-ebpf config --defaults | --validate FILE
    otel-ebpf gateway [--config FILE] [--grpc-endpoint H:P] [--http-endpoint H:P]
                      [--otlp-endpoint URL [--otlp-protocol grpc|http]] [--output DIR] | --defaults
    otel-ebpf demo [--nodes N] [--ranks-per-node R] [--steps S] [--straggler RANK] [--straggler-delay-ms MS]
                   [--kill-rank RANK --kill-after-step K] [--output DIR] [--otlp-endpoint URL]
    otel-ebpf twin [--nodes M] [--gpus-per-node G] [--output DIR] [--otlp-endpoint URL] [--no-trace]
                   [--timeout S] -- script.py [ARGS ...]
    otel-ebpf report DIR [-o report.html] [--perfetto trace.json]
    otel-ebpf export --parquet OUTDIR DIR

Exit codes: the traced command's own code for ``run -- CMD`` (0 for ``run --pid/--all-processes``;
127 when CMD is not found, 126 when it is not executable, said before anything is loaded), except 4
when an exporter delivered nothing and lost something (an unreachable collector for the whole run: the
summary names the exporter, what it lost, and the command's own code); 0 for ``gateway`` stopped by
SIGINT/SIGTERM (after flushing); 0 for a ``demo`` that ran as asked (an injected crash is
reported, not an error), 130 when it is interrupted (and for ``run --pid`` stopped by a second
SIGINT/SIGTERM while its probes attach); 2 for configuration (or option) errors;
3 when the host cannot run eBPF (``check`` explains why); 1 for other agent errors (for
``demo``: a node, agent, rank or the gateway failed, named in the message). ``twin``: 0 when every rank
exited 0, 1 when one failed (or the job timed out), 2 bad options, 3 the host cannot run it.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from otel_ebpf.core.version import __version__
from otel_ebpf.core import gctune
from otel_ebpf.core.config import ENV_PREFIX
from otel_ebpf.core.errors import ConfigError, EnvironmentError_, OtelEbpfError
from otel_ebpf.report import cli as report_cli

__all__ = ["main"]

log = logging.getLogger("otel_ebpf")
LOG_LEVELS = ("debug", "info", "warning", "error")

RUN_EXAMPLES = """examples:
  otel-ebpf run -- python train.py --epochs 1
      trace a training script and everything it starts; OTLP JSON lines land in ./otel-ebpf-out/
  otel-ebpf run --otlp-endpoint http://127.0.0.1:4317 -- torchrun --nproc-per-node 8 train.py
      send spans and metrics to an OpenTelemetry Collector over gRPC
  otel-ebpf run --pid 4242 --otlp-endpoint http://collector:4318 --otlp-protocol http
      attach to a running process until Ctrl+C
  otel-ebpf run --all-processes --config /etc/otel-ebpf/agent.yaml
      node agent: every process that loads CUDA or NCCL (what deploy/k8s and deploy/docker-compose.yaml run)
  otel-ebpf run --dump-bpf -- true
      print the BPF programs as compiled, then exit
On a terminal a live line shows events, spans and drops per second (--quiet hides it); a summary
is printed at the end: per exporter what was sent and what was lost (by signal and reason).
exit code: the command's own, or 4 when an exporter delivered nothing (an unreachable collector);
127 the command is not found, 126 it is not executable (both said at once, as a shell would);
2 config errors, 3 the host cannot run eBPF, 1 other agent errors.
"""


MAIN_EXAMPLES = """examples:
  otel-ebpf check                                   what works here, and the fix for what does not
  otel-ebpf run -- python train.py                  trace a command (see 'otel-ebpf run --help')
  otel-ebpf run --all-processes                     node agent mode
  otel-ebpf config --defaults                       every config key, documented
  otel-ebpf gateway --otlp-endpoint http://collector:4317
                                                    join collectives from many agents
  sudo otel-ebpf demo                               real PyTorch on simulated GPUs and nodes, traced, no GPU
  sudo otel-ebpf twin -- train.py                   your torchrun program on simulated GPUs and nodes, traced
"""


GATEWAY_EXAMPLES = """examples:
  otel-ebpf gateway --grpc-endpoint 0.0.0.0:4327 --otlp-endpoint http://collector:4317
      agents on every node run with --otlp-endpoint http://GATEWAY:4327; one trace per collective
  otel-ebpf gateway --output ./joined
      write joined traces as OTLP JSON lines
"""


DEMO_EXAMPLES = """examples:
  sudo otel-ebpf demo
      2 nodes x 2 ranks of FSDP2 + tensor parallel, 20 steps, the last rank 30 ms late to every step: the
      gateway names it
  sudo otel-ebpf demo --kill-rank 1 --kill-after-step 5
      rank 1 crashes: the collective it never joined is reported (partial, nccl.desync event)
  sudo otel-ebpf demo --otlp-endpoint http://127.0.0.1:4317
      the gateway also sends the joined traces to a Collector or Jaeger
"""


CHECK_EXAMPLES = """examples:
  otel-ebpf check
      one row per capability (privileges, BCC, kernel headers, tracefs, a real BPF load, CUDA, NCCL,
      Python USDT, NVML) with its status and, for each missing one, the fix; exit 3 if eBPF cannot run
  otel-ebpf check && otel-ebpf run --all-processes
      start the node agent only on a host that can run it
"""


CONFIG_EXAMPLES = """examples:
  otel-ebpf config --defaults > otel-ebpf.yaml
      every key with its default and documentation; keep only what you change
  otel-ebpf config --validate otel-ebpf.yaml
      check a file (errors name the key path, e.g. 'service.pipelines.default.receivers[0]')
      and print the effective config
"""


def _demo_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="a real PyTorch training job on simulated GPUs and nodes, traced (no GPU "
                                       "needed)",
                          description="Runs an FSDP2 + tensor-parallel training job (real PyTorch 2.11, the twin's "
                                      "simulated GPUs: kernels do nothing, timing is host timing) on N 'nodes' "
                                      "(network + UTS namespaces on a private bridge) x R ranks, an agent per node "
                                      "and a gateway joining every collective of every communicator; then prints "
                                      "what it found. Needs root and the twin (scripts/setup.sh).",
                          epilog=DEMO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--nodes", type=int, metavar="N", default=2, help="simulated nodes (default 2)")
    demo.add_argument("--ranks-per-node", type=int, metavar="R", default=2, help="ranks per node (default 2)")
    demo.add_argument("--steps", type=int, metavar="S", default=20, help="training steps (default 20)")
    demo.add_argument("--straggler", type=int, metavar="RANK",
                      help="rank that is late to every step (default: the last rank; -1: none)")
    demo.add_argument("--straggler-delay-ms", type=float, metavar="MS", default=30.0,
                      help="how late, in ms (default 30)")
    demo.add_argument("--straggler-cause", choices=("cpu", "sleep"), default="cpu",
                      help="what makes it late: 'cpu' computes longer (shows as on-CPU time), 'sleep' "
                           "blocks (off-CPU); the summary's 'why late' line names it (default cpu)")
    demo.add_argument("--kill-rank", type=int, metavar="RANK", help="rank that crashes (SIGKILL itself) ...")
    demo.add_argument("--kill-after-step", type=int, metavar="K", help="... after step K")
    demo.add_argument("--output", metavar="DIR", default="./otel-ebpf-demo-out",
                      help="the gateway's OTLP JSON lines and the logs (default ./otel-ebpf-demo-out)")
    demo.add_argument("--otlp-endpoint", metavar="URL", help="the gateway also exports here (OTLP/gRPC)")


TWIN_EXAMPLES = """examples:
  sudo otel-ebpf twin -- train.py --epochs 1
      2 nodes x 2 simulated GPUs, traced; joined collectives per communicator at the end
  sudo otel-ebpf twin --nodes 4 --gpus-per-node 2 --otlp-endpoint http://127.0.0.1:4317 -- train.py
      the gateway also sends the joined traces to a Collector or Jaeger
limits: kernels do nothing (computed values are meaningless), no Triton/torch.compile codegen, timing is host
timing. docs/twin.md.
"""


def _twin_parser(sub: Any) -> None:
    twin = sub.add_parser("twin", help="run a torchrun-style PyTorch program on simulated GPUs and nodes, traced",
                          description="Runs SCRIPT under torchrun on M 'nodes' (network + UTS namespaces) x G "
                                      "simulated GPUs: the real torch 2.11 CUDA wheel on the twin's stand-in "
                                      "CUDA/NCCL, an otel-ebpf agent per node, a gateway joining every collective. "
                                      "Needs root and the twin (scripts/setup.sh).",
                          epilog=TWIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    twin.add_argument("--nodes", type=int, metavar="M", default=2, help="namespace nodes (default 2)")
    twin.add_argument("--gpus-per-node", type=int, metavar="G", default=2, help="simulated GPUs per node (default 2)")
    twin.add_argument("--output", metavar="DIR", default="./otel-ebpf-twin-out",
                      help="the gateway's OTLP JSON lines and the logs (default ./otel-ebpf-twin-out)")
    twin.add_argument("--otlp-endpoint", metavar="URL", help="the gateway also exports here (OTLP/gRPC)")
    twin.add_argument("--no-trace", action="store_true", help="no agents, no gateway: the program alone")
    twin.add_argument("--timeout", type=float, metavar="S", default=600.0,
                      help="the whole job, seconds; everything is stopped at it (default 600)")
    twin.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="otel-ebpf", description="eBPF + NVML to OpenTelemetry for AI/ML jobs.",
                                epilog=MAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"otel-ebpf {__version__}")
    p.add_argument("--log-level", default=os.environ.get(f"{ENV_PREFIX}LOG_LEVEL", "warning"), choices=LOG_LEVELS,
                   help=f"agent log level (default: env {ENV_PREFIX}LOG_LEVEL, else warning); also accepted after "
                        "the subcommand")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="what works on this host and how to fix what does not",
                   description="Checks privileges, BCC, kernel headers, tracefs, loads a BPF program, and looks "
                               "for CUDA, NCCL, Python USDT and NVML. Exits non-zero if eBPF cannot run.",
                   epilog=CHECK_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run = sub.add_parser("run", help="trace a command, running processes, or every process",
                         epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help=f"YAML config merged over the defaults (env {ENV_PREFIX}CONFIG)")
    run.add_argument("--output", metavar="DIR", help="write OTLP JSON lines to DIR (default ./otel-ebpf-out when "
                                                     "no endpoint is given); added to the exporters a --config "
                                                     "file lists")
    run.add_argument("--otlp-endpoint", metavar="URL", help="export with OTLP to this collector (added to the "
                                                            "exporters a --config file lists)")
    run.add_argument("--otlp-protocol", choices=["grpc", "http"], help="OTLP transport (default grpc)")
    run.add_argument("--pid", type=int, action="append", default=[],
                     help="attach to a running process and the processes it has started (repeatable)")
    run.add_argument("--all-processes", action="store_true",
                     help="trace every process that loads a probed library (node agent mode)")
    run.add_argument("--service-name", help="service.name of traced processes (default: executable name)")
    run.add_argument("--strict", action="store_true", help="fail when any probe cannot attach")
    run.add_argument("--dump-bpf", action="store_true", help="print the BPF programs as compiled and exit")
    run.add_argument("--quiet", action="store_true", help="no live progress line on the terminal (it is shown "
                                                          "only when stderr is a terminal)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    cfg = sub.add_parser("config", help="print the default config or validate a file",
                         epilog=CONFIG_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = cfg.add_mutually_exclusive_group(required=True)
    g.add_argument("--defaults", action="store_true", help="the full default config, every key documented")
    g.add_argument("--validate", metavar="FILE", help="check FILE and print the effective config")
    gw = sub.add_parser("gateway", help="join NCCL collectives from every node's agent (OTLP in, OTLP out)",
                        epilog=GATEWAY_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    gw.add_argument("--config", help=f"YAML gateway config merged over the defaults (env {ENV_PREFIX}GATEWAY_CONFIG)")
    gw.add_argument("--grpc-endpoint", metavar="H:P", help="OTLP/gRPC listen address (default 127.0.0.1:4327; "
                                                            "port 0: any free port; '' disables)")
    gw.add_argument("--http-endpoint", metavar="H:P", help="OTLP/HTTP listen address (default 127.0.0.1:4328)")
    gw.add_argument("--otlp-endpoint", metavar="URL", help="export joined spans and metrics with OTLP here")
    gw.add_argument("--otlp-protocol", choices=["grpc", "http"], help="OTLP transport (default grpc)")
    gw.add_argument("--output", metavar="DIR", help="write OTLP JSON lines to DIR (default ./otel-ebpf-gateway-out "
                                                    "when no endpoint is given)")
    gw.add_argument("--defaults", action="store_true", help="print the default gateway config and exit")
    _demo_parser(sub)
    _twin_parser(sub)
    report_cli.add_parsers(sub)  # report, export: otel_ebpf/report/cli.py
    for subparser in sub.choices.values():  # 'otel-ebpf run --log-level info -- CMD' as well
        subparser.add_argument("--log-level", default=argparse.SUPPRESS, choices=LOG_LEVELS,
                               help="agent log level (as before the subcommand; this one wins)")
    return p


def _config(args: argparse.Namespace) -> int:
    from otel_ebpf.service import settings
    from otel_ebpf.core.config import to_plain

    if args.defaults:
        sys.stdout.write(settings.dump_defaults())
        return 0
    import yaml

    cfg = settings.load(args.validate)
    sys.stdout.write(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from otel_ebpf.gateway import Gateway, config

    if args.defaults:
        sys.stdout.write(config.dump_defaults())
        return 0
    cfg = config.load(args.config, output=args.output, endpoint=args.otlp_endpoint, protocol=args.otlp_protocol,
                      grpc_endpoint=args.grpc_endpoint, http_endpoint=args.http_endpoint)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    gctune.tune()
    gateway = Gateway(cfg)
    started = time.monotonic()
    try:
        gateway.start()
    except EnvironmentError_ as exc:  # a port in use: not a host problem 'check' could explain
        raise OtelEbpfError(str(exc.args[0]), hint=exc.hint) from None
    gctune.freeze_startup()
    ports = " ".join(f"{rid} grpc={g} http={h}" for rid, (g, h) in gateway.endpoints().items())
    print(f"otel-ebpf gateway listening: {ports}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        gateway.shutdown()
        n = gateway.summary()
        print(f"otel-ebpf gateway: {n['requests']} requests ({n['rejected']} rejected, {n['refused']} refused for "
              f"room), {n['received']} items received, {n['spans']} spans out, {n['logs']} log records out, "
              f"{n['dropped']} dropped, "
              f"{n['lost']} lost end to end (agents' drops included) in {time.monotonic() - started:.1f}s",
              file=sys.stderr)
        from otel_ebpf.service.run_cmd import delivery_line

        for eid, signals in sorted(gateway.deliveries().items()):
            c = gateway.cfg.exporters[eid]
            line, _ = delivery_line(eid, str(getattr(c, "directory", None) or getattr(c, "endpoint", "")), signals)
            print(f"otel-ebpf gateway: {line}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from otel_ebpf.demo.runner import DemoOptions, run

    return run(DemoOptions(nodes=args.nodes, ranks_per_node=args.ranks_per_node, steps=args.steps,
                           straggler=args.straggler, straggler_delay_ms=args.straggler_delay_ms,
                           straggler_cause=args.straggler_cause,
                           kill_rank=args.kill_rank, kill_after_step=args.kill_after_step, output=args.output,
                           otlp_endpoint=args.otlp_endpoint))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="otel-ebpf %(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "check":
            from otel_ebpf.service.check import render, run_checks

            rows = run_checks()
            print(render(rows))
            return 3 if any(r.required and r.status != "ok" for r in rows) else 0
        if args.cmd == "config":
            return _config(args)
        if args.cmd == "gateway":
            return _gateway(args)
        if args.cmd in report_cli.COMMANDS:
            return report_cli.run(args)
        if args.cmd == "demo":
            return _demo(args)
        if args.cmd == "twin":
            from otel_ebpf.demo import twin_cmd

            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            return twin_cmd.run(twin_cmd.TwinOptions(command, args.nodes, args.gpus_per_node, args.output,
                                                     args.otlp_endpoint, not args.no_trace, args.timeout))
        from otel_ebpf.service import run_cmd

        return run_cmd.run(args)
    except ConfigError as exc:
        print(f"otel-ebpf: {exc}", file=sys.stderr)
        return 2
    except EnvironmentError_ as exc:
        print(f"otel-ebpf: {exc}\n  run 'otel-ebpf check' for what is missing on this host", file=sys.stderr)
        return 3
    except OtelEbpfError as exc:
        print(f"otel-ebpf: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # e.g. run --pid's second Ctrl+C during the start: no traceback
        print("otel-ebpf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
