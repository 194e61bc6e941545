"""``otel-ebpf config --defaults``: the full default config as YAML, each key documented.

The documentation comes from the ``doc()`` metadata of each component's Config dataclass,
so the printed file and the code cannot disagree.
"""
from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from otel_ebpf.service import components
from otel_ebpf.core.config import ServiceConfig, constraints_text
from otel_ebpf.emit.exporters import EXPORTER_TYPES

__all__ = ["commented_yaml"]


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v)  # JSON strings and flow lists/maps are valid YAML


def _emit(obj: Any, indent: int, lines: list[str], exclude: tuple[str, ...] = ()) -> None:
    pad = "  " * indent
    for f in dataclasses.fields(obj):
        if f.name in exclude:
            continue
        value = getattr(obj, f.name)
        text = f.metadata.get("doc", "")
        if f.metadata.get("duration"):
            text += " (seconds, or a string like 500ms / 10s / 2m)"
        rule = constraints_text(f)
        if rule:
            text += f" Must be {rule}."
        for line in textwrap.wrap(text, 96 - len(pad)):
            lines.append(f"{pad}# {line}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            _emit(value, indent + 1, lines)
        elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            lines.append(f"{pad}{f.name}:")
            for k, v in value.items():
                lines.append(f"{pad}  {k}:")
                _emit(v, indent + 2, lines)
        else:
            lines.append(f"{pad}{f.name}: {_scalar(value)}")


def _section(title: str, items: dict[str, Any], lines: list[str], docs: dict[str, str]) -> None:
    lines.append(f"{title}:")
    for cid, cfg in items.items():
        if docs.get(cid):
            lines.append(f"  # {docs[cid]}")
        lines.append(f"  {cid}:")
        _emit(cfg, 2, lines)
    lines.append("")


def commented_yaml() -> str:
    """The default config, rendered from the typed classes so every field carries its doc."""
    from otel_ebpf.service.settings import AgentConfig

    recv = components.receivers()
    proc = components.processors()
    cfg = AgentConfig(
        receivers={t: f.config_class() for t, f in recv.items()},
        processors={t: f.config_class() for t, f in proc.items()},
        exporters={t: cls() for t, cls in EXPORTER_TYPES.items()},
        service=ServiceConfig(),
    )
    lines = ["# otel-ebpf default configuration (otel-ebpf config --defaults).",
             "# Any subset of it in a file given with --config is merged over these defaults.", ""]
    _section("receivers", cfg.receivers, lines, {t: f.description for t, f in recv.items()})
    _section("processors", cfg.processors, lines, {t: f.description for t, f in proc.items()})
    _section("exporters", cfg.exporters, lines, {
        "file": "OTLP JSON lines files (the default exporter).",
        "otlp": "OTLP over gRPC or HTTP with the OTel SDK exporters (used when --otlp-endpoint is given).",
        "prometheus": "A /metrics endpoint for Prometheus (off: add 'prometheus' to a pipeline's exporters)."})
    lines.append("service:")
    lines.append("  # Which components run, and how they connect.")
    lines.append("  pipelines:")
    lines.append("    default:")
    off = dict.fromkeys(t for t, f in [*recv.items(), *proc.items()] if not f.default_on)  # once per type
    lines.append("      # Off by default (name them here to enable): " + (", ".join(off) or "none"))
    lines.append(f"      receivers: {_scalar([t for t, f in recv.items() if f.default_on])}")
    lines.append(f"      processors: {_scalar([t for t, f in proc.items() if f.default_on])}")
    lines.append('      exporters: ["file"]')
    _emit(ServiceConfig(), 1, lines, exclude=("pipelines",))
    return "\n".join(lines) + "\n"
