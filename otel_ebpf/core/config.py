"""Typed configuration, shaped like an OpenTelemetry Collector config.

::

    receivers:  {cuda: {...}, nccl: {...}}
    processors: {cuda: {...}, nccl: {...}}
    exporters:  {file: {...}, otlp: {...}}
    service:
      pipelines: {default: {receivers: [cuda, nccl], processors: [cuda, nccl], exporters: [file]}}

Each component has one ``@dataclass`` config whose fields carry their default and a ``doc``
in ``field(metadata=...)``: that is the only place defaults live. :func:`build` turns plain
YAML data into those classes, naming the dotted key path of any unknown key or bad value.
Everything is validated before any probe is loaded.

Bounds are declared on the field, not re-checked by hand in each ``validate``:
``doc(16384, "...", min=1)``, ``doc(256, "...", pow2=True, max=256)``,
``doc(1.0, "...", duration=True, min=0.01)``. :func:`build` enforces them on every field
(after type conversion, before the class's own ``validate``, which keeps only cross-field
and special checks); :func:`constraints_text` renders them for the config reference.

Component ids follow the collector: ``type`` or ``type/name`` (``otlp/backup``).
Environment variables use the prefix ``OTEL_EBPF_`` (see :data:`ENV_PREFIX`).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import re
import stat
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from otel_ebpf.core.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "PipelineConfig",
    "ServiceConfig",
    "build",
    "component_type",
    "constraints_text",
    "doc",
    "key_path",
    "load_yaml_file",
    "parse_duration",
    "to_plain",
]

_EXPONENT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")  # 1e-5, 2.5E3: numbers YAML 1.1 leaves as strings

ENV_PREFIX = "OTEL_EBPF_"
T = TypeVar("T")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def doc(default: Any, text: str, *, duration: bool = False, min: float | None = None,
        max: float | None = None, pow2: bool = False, **extra: Any) -> Any:
    """A dataclass field with its default, documentation and declared constraints.

    ``duration=True`` accepts '10s' / '250ms' (seconds as a float). ``min`` / ``max`` are
    inclusive bounds (seconds for a duration); ``pow2`` asks for a power of two (so >= 1).
    :func:`build` enforces them, naming the key path. A default that breaks its own
    constraints raises ValueError here, at import time.
    """
    meta: dict[str, Any] = {"doc": text, **extra}
    if duration:
        meta["duration"] = True
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if pow2:
        meta["pow2"] = True
    if default is not None and _violation(meta, default) is not None:
        raise ValueError(f"default {default!r} breaks its own constraint: {_violation(meta, default)}")
    # Mutable defaults are deep-copied per instance: a shallow copy (dataclasses.replace) would
    # share a nested config's lists and dicts between every instance and the prototype.
    if isinstance(default, (list, dict, set)) or (
            dataclasses.is_dataclass(default) and not isinstance(default, type)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    return field(default=default, metadata=meta)


def _human(value: float, duration: bool) -> str:
    """A bound or value as the user writes it: durations in h / s / ms / us, numbers plainly."""
    if not duration:
        return f"{value:g}" if isinstance(value, float) else str(value)
    if value >= 3600 and value % 3600 == 0:
        return f"{value / 3600:g}h"
    if value >= 1 or value == 0:
        return f"{value:g}s"
    if value >= 1e-3:
        return f"{value * 1e3:g}ms"
    return f"{value * 1e6:g}us"


def _rule(meta: Mapping[str, Any]) -> str:
    """The declared constraints of one field as words ('' when it has none)."""
    dur = bool(meta.get("duration"))
    lo, hi = meta.get("min"), meta.get("max")
    if meta.get("pow2"):
        if hi is not None:
            return f"a power of two from {_human(lo if lo is not None else 1, dur)} to {_human(hi, dur)}"
        return "a power of two" if lo is None or lo <= 1 else f"a power of two >= {_human(lo, dur)}"
    if lo is not None and hi is not None:
        return f"between {_human(lo, dur)} and {_human(hi, dur)}"
    if lo is not None:
        return f"at least {_human(lo, dur)}" if dur else f">= {_human(lo, dur)}"
    if hi is not None:
        return f"<= {_human(hi, dur)}"
    return ""


def _violation(meta: Mapping[str, Any], value: Any) -> str | None:
    """The error message when ``value`` breaks the constraints in ``meta``, else None.

    Only numbers are checked (bools are not numbers here); NaN breaks any bound.
    """
    rule = _rule(meta)
    if not rule or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    lo, hi = meta.get("min"), meta.get("max")
    ok = (lo is None or value >= lo) and (hi is None or value <= hi)
    if meta.get("pow2"):
        ok = ok and isinstance(value, int) and value >= 1 and not value & (value - 1)
    return None if ok else f"must be {rule}, got {_human(value, bool(meta.get('duration')))}"


def constraints_text(f: dataclasses.Field[Any]) -> str:
    """The declared constraints of a config field in words, e.g. '>= 1', 'a power of two',
    'between 200ms and 300s'; '' when it declares none. For the generated config reference."""
    return _rule(f.metadata)


def parse_duration(value: Any, path: str) -> float:
    """Seconds from a number (seconds) or a string like '250ms', '10s', '2m'."""
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(path, f"duration must be >= 0, got {value}")
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _UNITS[m.group(2)]
    raise ConfigError(path, f"expected a duration like 10s, 500ms or a number of seconds, got {value!r}")


def key_path(path: str, key: str) -> str:
    """The dotted path of ``key`` under ``path`` ('' is the top level: no leading dot)."""
    return f"{path}.{key}" if path else key


def component_type(component_id: str) -> str:
    """'otlp/backup' -> 'otlp'."""
    return component_id.split("/", 1)[0]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, path: str, meta: dict[str, Any]) -> Any:
    origin = get_origin(tp)
    if meta.get("duration"):
        return parse_duration(value, path)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, path, meta)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(path, f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(path, f"must be one of {', '.join(map(repr, get_args(tp)))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected a list, got {type(value).__name__} {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        return [_convert(item_tp, v, f"{path}[{i}]", {}) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {type(value).__name__}")
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {_convert(key_tp, k, f"{path}", {}): _convert(val_tp, v, f"{path}.{k}", {})
                for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 (PyYAML) reads 1e-5 as a string; it needs 1.0e-5 to be a number
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return value
    raise ConfigError(path, f"unsupported config type {_type_name(tp)}")


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from plain data; unknown keys and bad values raise ConfigError.

    Missing keys take the field default. Then every field's declared constraints (``min``,
    ``max``, ``pow2`` in :func:`doc`) are checked, and last an instance method
    ``validate(path)`` is called when the class defines one.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping of keys, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        known = f"known keys: {', '.join(sorted(fields))}" if fields else "it takes no keys"
        raise ConfigError(key_path(path, str(unknown[0])), f"unknown key ({known})")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, key_path(path, name), dict(fields[name].metadata))
    obj = cls(**kwargs)
    for f in fields.values():  # every field, defaults included: a constraint is a contract
        problem = _violation(f.metadata, getattr(obj, f.name))
        if problem is not None:
            raise ConfigError(key_path(path, f.name), problem)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(path)
    return obj


def to_plain(obj: Any) -> Any:
    """Inverse of :func:`build`: dataclasses to plain dicts/lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def parse_host_port(text: str, path: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); raises ConfigError naming ``path``."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(path, f"{text!r} is not HOST:PORT", hint="e.g. 127.0.0.1:13133 or 0.0.0.0:13133; '' disables")
    return host, int(port)


@dataclass
class PipelineConfig:
    """One pipeline: receivers fan in, processors run in order, exporters fan out."""

    receivers: list[str] = doc([], "Receiver ids feeding this pipeline.")
    processors: list[str] = doc([], "Processor ids, applied in this order.")
    exporters: list[str] = doc([], "Exporter ids that receive every span and metric.")


@dataclass
class K8sConfig:
    """Kubernetes metadata of traced processes (otel_ebpf.host.k8s; docs/receivers.md)."""

    enabled: bool = doc(True, "Add k8s.pod.name, k8s.namespace.name, k8s.container.name, k8s.node.name to "
                              "the resource of a process in a pod (pod uid from its cgroup).")
    kubelet_url: str = doc("auto", "Kubelet pod list: 'auto' (https://$NODE_NAME:10250/pods when the agent "
                                   "runs in a pod with a service-account token), 'off', or a URL.")
    token_file: str = doc("/var/run/secrets/kubernetes.io/serviceaccount/token",
                          "Bearer token for the kubelet (sent over https only; re-read at each fetch).")
    ca_file: str = doc("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                       "CA bundle that signed the kubelet's serving certificate.")
    insecure_skip_verify: bool = doc(False, "Do not verify the kubelet's certificate (self-signed kubelets).")
    refresh_interval: float = doc(10.0, "Least time between two pod-list fetches (one is made when a pod "
                                        "uid is not in the last list).", duration=True, min=1)
    timeout: float = doc(2.0, "Longest wait for one pod-list fetch.", duration=True, min=0.1, max=60)
    max_pods: int = doc(1024, "Pods kept from one list; the rest are counted as dropped (pod_table_full).",
                        min=1)

    def validate(self, path: str) -> None:
        if self.kubelet_url not in ("auto", "off") and not self.kubelet_url.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.kubelet_url", f"must be auto, off or an http(s) URL, not {self.kubelet_url!r}")


@dataclass
class ServiceConfig:
    """What runs: pipelines plus agent-wide settings."""

    pipelines: dict[str, PipelineConfig] = doc({}, "Named pipelines (usually one, 'default').")
    strict: bool = doc(False, "Make probe attach failures fatal instead of warnings.")
    service_name: str = doc("", "service.name for traced processes; empty means the executable name.")
    resource_attributes: dict[str, str] = doc({}, "Extra resource attributes added to every traced process.")
    metrics_interval: float = doc(10.0, "How often metrics are collected and exported.", duration=True, min=0.05)
    metrics_warmup: float = doc(
        60.0, "For this long after the agent starts, metrics are collected and exported every second (or every "
              "metrics_interval if shorter), so a job of a few seconds has readings to chart; 0 turns it off.",
        duration=True, min=0.0)
    max_processes: int = doc(1024, "Most traced processes with their own OTel resource at once; "
                                   "beyond it the oldest is flushed and dropped (counted).", min=1)
    max_queue: int = doc(65536, "Most events waiting between receivers and processors; "
                               "beyond it events are dropped (counted in otel_ebpf.events.dropped).", min=1)
    health_endpoint: str = doc("127.0.0.1:13133", "HOST:PORT serving /healthz and /readyz (otel_ebpf.service.health); "
                                                  "'' disables it. Loopback by default; 0.0.0.0:13133 in a pod.")
    k8s: K8sConfig = doc(K8sConfig(), "Kubernetes pod/container/node names on process resources.")
    pause_timeout: float = doc(
        2.0, "Longest a process stays stopped by a receiver's pause_on_load, whatever the agent does "
             "(stopped, hung, starved, killed): a supervisor process resumes it then, and stops are made only "
             "while the agent's poll loops and the supervisor renew their leases (half this time). A process "
             "resumed that way runs untraced until its probes attach; counted in "
             "otel_ebpf.pauses.timed_out (docs/reliability.md, 'The pause guard').", duration=True,
        min=0.2, max=300)
    deferred_start: bool = doc(
        True, "run -- CMD starts the command once the lifecycle receiver (and python, probes, apptrace when on) and a "
              "small library gate are loaded (~1-2 s), and compiles the other receivers while it runs: a process that "
              "opens the library of one still compiling (cuda, nccl, torch) is held until it is attached "
              "(while the agent makes progress, else pause_timeout; 60 s at most); blockio, memory, sched and "
              "perf see the command from when they are loaded "
              "(logged). false: every receiver is loaded before the command starts (~6 s with the defaults). Off "
              "with strict (a late receiver's failure cannot stop the job) and for --pid / --all-processes "
              "(docs/reliability.md, 'Deferred start').")
    shutdown_timeout: float = doc(
        60.0, "Longest the agent spends, once tracing stops, handing on what it collected: the pipeline's "
              "backlog, then each exporter's queue (the last metrics get 5s more). What is left then is counted "
              "dropped (reasons shutdown, export_shutdown) and named in the run's summary.", duration=True,
        min=1, max=3600)

    def validate(self, path: str) -> None:
        if self.health_endpoint:
            parse_host_port(self.health_endpoint, f"{path}.health_endpoint")


def load_yaml_file(path: str | os.PathLike[str], *, allow_insecure: bool = False) -> dict[str, Any]:
    """Read a YAML config file, refusing world-writable files (anyone could add probes).

    Raises ConfigError naming the file for unreadable, unsafe or malformed input.
    """
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {p}: {exc.strerror or exc}") from None
    if st.st_mode & stat.S_IWOTH and not allow_insecure:
        raise ConfigError("", f"config file {p} is world-writable: anyone on this host could make the "
                              "agent (running as root) probe any process",
                          hint=f"chmod o-w {p}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{p} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data
