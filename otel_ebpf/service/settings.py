"""The whole agent config: defaults, file, environment and CLI overrides, validated at once.

Order (later wins): built-in defaults (each component's Config) < the YAML file (deep-merged:
mappings merge, lists and scalars replace) < ``OTEL_EBPF_*`` environment < command-line flags.
``--output`` / ``--otlp-endpoint`` (and their variables) add their exporter to every pipeline whose
exporters the file lists, and replace the built-in default ``[file]`` elsewhere.
Unknown component types, unknown keys, pipelines naming undefined components and receivers
without their processor raise ConfigError with the key path, before any probe is loaded.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.service import components
from otel_ebpf.core.config import ENV_PREFIX, ServiceConfig, build, component_type, load_yaml_file, to_plain
from otel_ebpf.emit.exporter_config import EXPORTER_TYPES
from otel_ebpf.core.errors import ConfigError

__all__ = ["ENV_VARS", "AgentConfig", "default_data", "load"]

ENV_VARS = {
    f"{ENV_PREFIX}CONFIG": "Path of the YAML config file (same as --config).",
    f"{ENV_PREFIX}OUTPUT": "Directory for OTLP JSON lines (same as --output).",
    f"{ENV_PREFIX}OTLP_ENDPOINT": "OTLP endpoint (same as --otlp-endpoint).",
    f"{ENV_PREFIX}OTLP_PROTOCOL": "grpc or http (same as --otlp-protocol).",
    f"{ENV_PREFIX}LOG_LEVEL": "Agent log level: debug, info, warning (default), error.",
}


@dataclass
class AgentConfig:
    receivers: dict[str, Any] = field(default_factory=dict)
    processors: dict[str, Any] = field(default_factory=dict)
    exporters: dict[str, Any] = field(default_factory=dict)
    service: ServiceConfig = field(default_factory=ServiceConfig)


def default_data() -> dict[str, Any]:
    """The full default config as plain data: every registered component with its defaults."""
    recv = {t: to_plain(f.config_class()) for t, f in components.receivers().items()}
    proc = {t: to_plain(f.config_class()) for t, f in components.processors().items()}
    exp = {"file": to_plain(EXPORTER_TYPES["file"]())}
    service = to_plain(ServiceConfig())
    on_r = [t for t, f in components.receivers().items() if f.default_on]
    on_p = [t for t, f in components.processors().items() if f.default_on]
    service["pipelines"] = {"default": {"receivers": on_r, "processors": on_p,
                                        "exporters": ["file"]}}
    return {"receivers": recv, "processors": proc, "exporters": exp, "service": service}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _overrides(output: str | None, endpoint: str | None, protocol: str | None) -> tuple[dict[str, Any], list[str]]:
    """The exporter configs the flags (or their environment variables) set, and the exporter ids they add."""
    output = output or os.environ.get(f"{ENV_PREFIX}OUTPUT")
    endpoint = endpoint or os.environ.get(f"{ENV_PREFIX}OTLP_ENDPOINT")
    protocol = protocol or os.environ.get(f"{ENV_PREFIX}OTLP_PROTOCOL")
    exporters: dict[str, Any] = {}
    names: list[str] = []
    if endpoint:
        exporters["otlp"] = {"endpoint": endpoint, **({"protocol": protocol} if protocol else {})}
        names.append("otlp")
    if output:
        exporters["file"] = {"directory": output}
        names.append("file")
    if not names and protocol:
        exporters["otlp"] = {"protocol": protocol}  # applies to a configured otlp exporter
    return exporters, names


def _add_flag_exporters(pipelines: dict[str, Any], names: list[str], from_file: set[str]) -> None:
    """``--output`` / ``--otlp-endpoint`` add their exporters to every pipeline. A pipeline whose exporters the
    config file lists keeps them (a prometheus exporter there still listens); one with the built-in default
    (``[file]``, written to ./otel-ebpf-out) has it replaced: a flag says where the data goes instead."""
    if not names:
        return
    for pname, pdata in pipelines.items():
        if not isinstance(pdata, dict):
            continue  # reported by the pipeline's own validation
        current = pdata.get("exporters")
        if pname in from_file and isinstance(current, list):
            pdata["exporters"] = current + [n for n in names if n not in current]
        else:
            pdata["exporters"] = list(names)


def _build_section(section: str, data: Any, registry: dict[str, type]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(section, "expected a mapping of component ids to their config")
    out: dict[str, Any] = {}
    for cid, cdata in data.items():
        ctype = component_type(str(cid))
        if ctype not in registry:
            raise ConfigError(f"{section}.{cid}", f"unknown {section[:-1]} type '{ctype}' "
                                                  f"(known: {', '.join(sorted(registry))})")
        out[str(cid)] = build(registry[ctype], cdata, f"{section}.{cid}")
    return out


def _check_pipelines(cfg: AgentConfig) -> None:
    if not cfg.service.pipelines:
        raise ConfigError("service.pipelines", "at least one pipeline is needed")
    for name, p in cfg.service.pipelines.items():
        for kind, ids, known in (("receivers", p.receivers, cfg.receivers),
                                 ("processors", p.processors, cfg.processors),
                                 ("exporters", p.exporters, cfg.exporters)):
            for i, cid in enumerate(ids):
                if cid not in known:
                    raise ConfigError(f"service.pipelines.{name}.{kind}[{i}]",
                                      f"'{cid}' is not defined under '{kind}:'")
        if not p.receivers or not p.exporters:
            raise ConfigError(f"service.pipelines.{name}", "needs at least one receiver and one exporter")
        _check_receiver_processors(name, p.receivers, p.processors)


def _check_receiver_processors(name: str, receivers: list[str], processors: list[str]) -> None:
    """A receiver whose type has a processor of the same type (cuda, python, ...) emits raw events only that
    processor turns into spans and metrics; the emit stage ignores them. Without it in the same pipeline the
    receiver would load its probes and produce nothing, so that is a config error naming the fix (the
    Collector's way: no component is added behind the user's back). nvml has no processor."""
    ptypes = {component_type(pid) for pid in processors}
    known = components.processors()
    for i, rid in enumerate(receivers):
        rtype = component_type(rid)
        if rtype in known and rtype not in ptypes:
            raise ConfigError(f"service.pipelines.{name}.receivers[{i}]",
                              f"receiver '{rid}' needs processor '{rtype}' in the same pipeline: without it "
                              "its events become no span or metric",
                              hint=f"add '{rtype}' to service.pipelines.{name}.processors (it pairs the probe "
                                   f"records), or remove '{rid}' from the receivers")


def load(path: str | None = None, *, output: str | None = None, endpoint: str | None = None,
         protocol: str | None = None, extra: dict[str, Any] | None = None) -> AgentConfig:
    """Build and validate the agent config. Raises ConfigError naming the key path."""
    data = default_data()
    from_file: set[str] = set()  # pipelines whose exporters the file lists
    path = path or os.environ.get(f"{ENV_PREFIX}CONFIG")
    if path:
        user = load_yaml_file(path)
        unknown = set(user) - {"receivers", "processors", "exporters", "service"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "unknown top-level key (known: receivers, processors, "
                                                  "exporters, service)")
        data = _merge(data, user)
        user_pipes = (user.get("service") or {}).get("pipelines") if isinstance(user.get("service"), dict) else None
        if isinstance(user_pipes, dict):  # the file's pipelines are the ones that run; same-named ones merge
            data["service"]["pipelines"] = {k: v for k, v in data["service"]["pipelines"].items() if k in user_pipes}
            from_file = {str(k) for k, v in user_pipes.items() if isinstance(v, dict) and "exporters" in v}
    flag_exporters, names = _overrides(output, endpoint, protocol)
    if "otlp" in flag_exporters and "otlp" not in data.get("exporters", {}) and not (endpoint or os.environ.get(
            f"{ENV_PREFIX}OTLP_ENDPOINT")):
        raise ConfigError("exporters.otlp", "--otlp-protocol (or OTEL_EBPF_OTLP_PROTOCOL) was given but no OTLP "
                                            "endpoint: add --otlp-endpoint or an 'otlp' exporter to the config")
    data = _merge(data, {"exporters": flag_exporters})
    if isinstance(data.get("service"), dict) and isinstance(data["service"].get("pipelines"), dict):
        _add_flag_exporters(data["service"]["pipelines"], names, from_file)
    if extra:
        data = _merge(data, extra)
    cfg = AgentConfig(
        receivers=_build_section("receivers", data.get("receivers") or {},
                                 {t: f.config_class for t, f in components.receivers().items()}),
        processors=_build_section("processors", data.get("processors") or {},
                                  {t: f.config_class for t, f in components.processors().items()}),
        exporters=_build_section("exporters", data.get("exporters") or {}, EXPORTER_TYPES),
        service=build(ServiceConfig, data.get("service"), "service"),
    )
    _check_pipelines(cfg)
    return cfg


def dump_defaults() -> str:
    """The default config as commented YAML: every key with its documentation."""
    from otel_ebpf.service.config_reference import commented_yaml

    return commented_yaml()

