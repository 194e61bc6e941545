"""The gateway config: defaults, file, environment and CLI overrides, validated at once.

Shaped like the agent's (:mod:`otel_ebpf.service.settings`) and a Collector's::

    receivers:  {otlp: {grpc_endpoint: 127.0.0.1:4327, http_endpoint: 127.0.0.1:4328, ...}}
    processors: {collective_join: {timeout: 5s, ...}}
    exporters:  {file: {...}, otlp: {...}}          # the agent's exporter configs
    service:
      pipelines: {default: {receivers: [otlp], processors: [collective_join], exporters: [file]}}

Order (later wins): defaults < YAML file (deep-merged) < ``OTEL_EBPF_GATEWAY_*`` environment <
command-line flags. The gateway runs exactly one pipeline. Unknown types or keys, bad values,
pipelines naming undefined components, and an OTLP exporter pointed at the gateway's own
receiver raise ConfigError naming the key path. The gateway has its own variables
(:data:`ENV_VARS`) so an agent's ``OTEL_EBPF_OTLP_ENDPOINT`` (which points at the gateway) is
never taken for the gateway's own destination.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from otel_ebpf.core.config import (
    ENV_PREFIX,
    PipelineConfig,
    build,
    component_type,
    doc,
    load_yaml_file,
    to_plain,
)
from otel_ebpf.emit.exporter_config import BatchConfig
from otel_ebpf.emit.exporters import EXPORTER_TYPES, FileExporterConfig, OtlpExporterConfig
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.gateway import components
from otel_ebpf.receivers.otlp import Config as OtlpReceiverConfig
from otel_ebpf.receivers.otlp.server import parse_endpoint
from otel_ebpf.service.settings import _build_section, _merge

__all__ = ["ENV_VARS", "GATEWAY_ENV_PREFIX", "GatewayConfig", "GatewayServiceConfig", "OtlpReceiverConfig",
           "default_data", "dump_defaults", "load"]

GATEWAY_ENV_PREFIX = f"{ENV_PREFIX}GATEWAY_"
ENV_VARS = {
    f"{GATEWAY_ENV_PREFIX}CONFIG": "Path of the gateway's YAML config file (same as --config).",
    f"{GATEWAY_ENV_PREFIX}OUTPUT": "Directory for OTLP JSON lines (same as --output).",
    f"{GATEWAY_ENV_PREFIX}OTLP_ENDPOINT": "Where the gateway exports over OTLP (same as --otlp-endpoint).",
    f"{GATEWAY_ENV_PREFIX}OTLP_PROTOCOL": "grpc or http (same as --otlp-protocol).",
}
_SECTIONS = ("receivers", "processors", "exporters", "service")


@dataclass
class GatewayServiceConfig:
    """What runs: one pipeline, plus gateway-wide settings."""

    pipelines: dict[str, PipelineConfig] = doc({}, "Exactly one named pipeline.")
    metrics_interval: float = doc(10.0, "How often the gateway's own metrics are exported.", duration=True,
                                  min=0.05)
    max_queue: int = doc(65536, "Most spans and log records waiting between the receiver and the join; a request "
                                "that does not fit is refused whole (UNAVAILABLE / 503, see "
                                "receivers.otlp.retry_after) and counted in otel_ebpf.events.refused; the agent "
                                "retries it.", min=1)
    max_metric_queue: int = doc(256, "Most metrics requests (one per agent export, each at most "
                                     "receivers.otlp.max_request_bytes) waiting for the exporters; beyond it "
                                     "requests are refused like spans.", min=1)
    max_export_wait: float = doc(300.0, "Longest the pipeline holds spans while an exporter's span queue is "
                                        "full (downstream slow or down), so the trace queue fills and requests "
                                        "are refused instead of dropped here; then they are handed over and "
                                        "what does not fit is counted (export_queue_full). 0: never wait. "
                                        "300s: an exporter's retry_on_failure.max_elapsed_time.", duration=True,
                                  max=3600)
    tick_interval: float = doc(0.1, "How often the join is woken while no spans arrive, so timeouts and "
                                    "desync reports fire during a hang.", duration=True,
                               min=0.001, max=60)
    health_endpoint: str = doc("127.0.0.1:13134", "HOST:PORT serving /healthz and /readyz (otel_ebpf.service.health); "
                                                  "'' disables it. 13134, not 13133, so an agent fits on the host.")

    def validate(self, path: str) -> None:
        if self.health_endpoint:
            from otel_ebpf.core.config import parse_host_port

            parse_host_port(self.health_endpoint, f"{path}.health_endpoint")


@dataclass
class GatewayConfig:
    receivers: dict[str, OtlpReceiverConfig] = field(default_factory=dict)
    processors: dict[str, Any] = field(default_factory=dict)
    exporters: dict[str, Any] = field(default_factory=dict)
    service: GatewayServiceConfig = field(default_factory=GatewayServiceConfig)

    @property
    def pipeline(self) -> PipelineConfig:
        return next(iter(self.service.pipelines.values()))


#: The gateway's exporters send up to this many spans a request unless their ``batch.batch_size`` is set (the
#: agent's, the SDK's, is 512). The gateway's input comes batched already and its output is every rank span it got:
#: through gRPC in and out at 1,024 ranks, 2,048 took ~20 % less gateway CPU a rank span than 512, the same as 4,096
#: (docs/benchmarks.md, session 27). ~410 bytes a rank span: ~1 MB requests, under an OpenTelemetry Collector's
#: default 4 MiB gRPC receive limit.
BATCH_SIZE = 2048


def _default_file_exporter() -> FileExporterConfig:
    return FileExporterConfig(directory="./otel-ebpf-gateway-out", batch=BatchConfig(batch_size=BATCH_SIZE))


def _batched(exporters: Any) -> Any:
    """``exporters`` (a config section as given) with :data:`BATCH_SIZE` for each of a type with a ``batch``
    section (file, otlp; not prometheus) that does not set its ``batch.batch_size`` (no more than a ``queue_size``
    it sets); anything malformed or unknown as it was, for the build to name."""
    if not isinstance(exporters, dict):
        return exporters
    out: dict[Any, Any] = {}
    for name, exp in exporters.items():
        kind = EXPORTER_TYPES.get(component_type(str(name)))
        batched = kind is not None and "batch" in {f.name for f in fields(kind)}
        batch = exp.get("batch", {}) if batched and isinstance(exp, dict) else None
        if isinstance(batch, dict) and "batch_size" not in batch:
            queue = batch.get("queue_size")
            size = min(BATCH_SIZE, queue) if type(queue) is int and queue >= 1 else BATCH_SIZE
            exp = {**exp, "batch": {**batch, "batch_size": size}}
        out[name] = exp
    return out


def default_data() -> dict[str, Any]:
    """The full default gateway config as plain data."""
    recv = {t: to_plain(f.config_class()) for t, f in components.receivers().items()}
    proc = {t: to_plain(f.config_class()) for t, f in components.processors().items()}
    exp = {"file": to_plain(_default_file_exporter())}
    service = to_plain(GatewayServiceConfig())
    service["pipelines"] = {"default": {"receivers": list(recv), "processors": list(proc), "exporters": ["file"]}}
    return {"receivers": recv, "processors": proc, "exporters": exp, "service": service}


def _exporter_overrides(data: dict[str, Any], output: str | None, endpoint: str | None,
                        protocol: str | None) -> dict[str, Any]:
    env = os.environ.get
    output = output or env(f"{GATEWAY_ENV_PREFIX}OUTPUT")
    endpoint = endpoint or env(f"{GATEWAY_ENV_PREFIX}OTLP_ENDPOINT")
    protocol = protocol or env(f"{GATEWAY_ENV_PREFIX}OTLP_PROTOCOL")
    exporters: dict[str, Any] = {}
    names: list[str] = []
    if endpoint:
        exporters["otlp"] = {"endpoint": endpoint, **({"protocol": protocol} if protocol else {})}
        names.append("otlp")
    elif protocol:
        if not isinstance(data.get("exporters"), dict) or "otlp" not in data["exporters"]:
            raise ConfigError("exporters.otlp", "--otlp-protocol was given but no OTLP endpoint: add "
                                                "--otlp-endpoint or an 'otlp' exporter to the config")
        exporters["otlp"] = {"protocol": protocol}
    if output:
        exporters["file"] = {"directory": output}
        names.append("file")
    given = data.get("exporters")
    given = given if isinstance(given, dict) else {}
    new = _batched({k: v for k, v in exporters.items() if k not in given})  # the config's own keep their batch
    over: dict[str, Any] = {"exporters": {k: new.get(k, v) for k, v in exporters.items()}}
    service = data.get("service")  # not yet validated: a list or scalar is a ConfigError later
    pipes = service.get("pipelines") if isinstance(service, dict) else None
    if names and isinstance(pipes, dict) and len(pipes) == 1:
        over["service"] = {"pipelines": {next(iter(pipes)): {"exporters": names}}}
    return over


def _receiver_overrides(grpc_endpoint: str | None, http_endpoint: str | None) -> dict[str, Any]:
    otlp = {k: v for k, v in (("grpc_endpoint", grpc_endpoint), ("http_endpoint", http_endpoint)) if v is not None}
    return {"receivers": {"otlp": otlp}} if otlp else {}


def _check(cfg: GatewayConfig) -> None:
    pipes = cfg.service.pipelines
    if len(pipes) != 1:
        raise ConfigError("service.pipelines", f"the gateway runs exactly one pipeline, got {len(pipes)}")
    name, p = next(iter(pipes.items()))
    for kind, ids, known in (("receivers", p.receivers, cfg.receivers), ("processors", p.processors, cfg.processors),
                             ("exporters", p.exporters, cfg.exporters)):
        for i, cid in enumerate(ids):
            if cid not in known:
                raise ConfigError(f"service.pipelines.{name}.{kind}[{i}]", f"'{cid}' is not defined under '{kind}:'")
    if not p.receivers or not p.exporters:
        raise ConfigError(f"service.pipelines.{name}", "needs at least one receiver and one exporter")
    listening = {parse_endpoint(e) for r in p.receivers for e in (cfg.receivers[r].grpc_endpoint,
                                                                  cfg.receivers[r].http_endpoint) if e}
    for eid in p.exporters:
        exp = cfg.exporters[eid]
        if isinstance(exp, OtlpExporterConfig) and parse_endpoint(exp.endpoint) in listening:
            raise ConfigError(f"exporters.{eid}.endpoint", f"{exp.endpoint} is the gateway's own receiver: "
                                                           "it would export to itself")


def load(path: str | None = None, *, output: str | None = None, endpoint: str | None = None,
         protocol: str | None = None, grpc_endpoint: str | None = None,
         http_endpoint: str | None = None) -> GatewayConfig:
    """Build and validate the gateway config. Raises ConfigError naming the key path."""
    data = default_data()
    path = path or os.environ.get(f"{GATEWAY_ENV_PREFIX}CONFIG")
    if path:
        user = load_yaml_file(path)
        unknown = sorted(set(user) - set(_SECTIONS))
        if unknown:
            raise ConfigError(unknown[0], f"unknown top-level key (known: {', '.join(_SECTIONS)})")
        if "exporters" in user:
            user = {**user, "exporters": _batched(user["exporters"])}
        data = _merge(data, user)
        user_pipes = user.get("service", {}).get("pipelines") if isinstance(user.get("service"), dict) else None
        if isinstance(user_pipes, dict):  # the file's pipelines are the ones that run
            data["service"]["pipelines"] = {k: v for k, v in data["service"]["pipelines"].items() if k in user_pipes}
    data = _merge(data, _exporter_overrides(data, output, endpoint, protocol))
    data = _merge(data, _receiver_overrides(grpc_endpoint, http_endpoint))
    cfg = GatewayConfig(
        receivers=_build_section("receivers", data.get("receivers") or {},
                                 {t: f.config_class for t, f in components.receivers().items()}),
        processors=_build_section("processors", data.get("processors") or {},
                                  {t: f.config_class for t, f in components.processors().items()}),
        exporters=_build_section("exporters", data.get("exporters") or {}, EXPORTER_TYPES),
        service=build(GatewayServiceConfig, data.get("service"), "service"),
    )
    _check(cfg)
    return cfg


def dump_defaults() -> str:
    """The default gateway config as commented YAML: every key with its documentation."""
    from otel_ebpf.service.config_reference import _emit, _scalar, _section

    lines = ["# otel-ebpf gateway default configuration (otel-ebpf gateway --defaults).",
             "# Any subset of it in a file given with --config is merged over these defaults.", ""]
    _section("receivers", {t: f.config_class() for t, f in components.receivers().items()}, lines,
             {"otlp": "OTLP/gRPC and OTLP/HTTP from the agents."})
    procs = components.processors()
    _section("processors", {t: f.config_class() for t, f in procs.items()}, lines,
             {t: f.description for t, f in procs.items()})
    _section("exporters", {"file": _default_file_exporter()}, lines,
             {"file": "OTLP JSON lines files (the default; an 'otlp' exporter is used with --otlp-endpoint)."})
    lines += ["service:", "  pipelines:", "    default:",
              f"      receivers: {_scalar(list(components.receivers()))}",
              f"      processors: {_scalar(list(procs))}", '      exporters: ["file"]']
    _emit(GatewayServiceConfig(), 1, lines, exclude=("pipelines",))
    return "\n".join(lines) + "\n"
