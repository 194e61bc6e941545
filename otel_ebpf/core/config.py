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
    "doc",
    "load_yaml_file",
    "parse_duration",
    "to_plain",
]

ENV_PREFIX = "OTEL_EBPF_"
T = TypeVar("T")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)?\s*$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def doc(default: Any, text: str, **extra: Any) -> Any:
    """A dataclass field with its default and documentation (``duration=True`` accepts '10s')."""
    meta = {"doc": text, **extra}
    # Mutable defaults are deep-copied per instance: a shallow copy (dataclasses.replace) would
    # share a nested config's lists and dicts between every instance and the prototype.
    if isinstance(default, (list, dict, set)) or (
            dataclasses.is_dataclass(default) and not isinstance(default, type)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    return field(default=default, metadata=meta)


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

    Missing keys take the field default. After building, an instance method
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
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise ConfigError(where, f"unknown key (known keys: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in data.items():
        sub = f"{path}.{name}" if path else name
        kwargs[name] = _convert(hints[name], value, sub, dict(fields[name].metadata))
    obj = cls(**kwargs)
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
                                        "uid is not in the last list).", duration=True)
    timeout: float = doc(2.0, "Longest wait for one pod-list fetch.", duration=True)
    max_pods: int = doc(1024, "Pods kept from one list; the rest are counted as dropped (pod_table_full).")

    def validate(self, path: str) -> None:
        if self.kubelet_url not in ("auto", "off") and not self.kubelet_url.startswith(("http://", "https://")):
            raise ConfigError(f"{path}.kubelet_url", f"must be auto, off or an http(s) URL, not {self.kubelet_url!r}")
        for key, bad, rule in (("refresh_interval", self.refresh_interval < 1, "at least 1s"),
                               ("timeout", not 0.1 <= self.timeout <= 60, "between 100ms and 60s"),
                               ("max_pods", self.max_pods < 1, ">= 1")):
            if bad:
                raise ConfigError(f"{path}.{key}", f"must be {rule}")


@dataclass
class ServiceConfig:
    """What runs: pipelines plus agent-wide settings."""

    pipelines: dict[str, PipelineConfig] = doc({}, "Named pipelines (usually one, 'default').")
    strict: bool = doc(False, "Make probe attach failures fatal instead of warnings.")
    service_name: str = doc("", "service.name for traced processes; empty means the executable name.")
    resource_attributes: dict[str, str] = doc({}, "Extra resource attributes added to every traced process.")
    metrics_interval: float = doc(10.0, "How often metrics are collected and exported.", duration=True)
    max_processes: int = doc(1024, "Most traced processes with their own OTel resource at once; "
                                   "beyond it the oldest is flushed and dropped (counted).")
    max_queue: int = doc(65536, "Most events waiting between receivers and processors; "
                               "beyond it events are dropped (counted in otel_ebpf.events.dropped).")
    health_endpoint: str = doc("127.0.0.1:13133", "HOST:PORT serving /healthz and /readyz (otel_ebpf.service.health); "
                                                  "'' disables it. Loopback by default; 0.0.0.0:13133 in a pod.")
    k8s: K8sConfig = doc(K8sConfig(), "Kubernetes pod/container/node names on process resources.")
    pause_timeout: float = doc(
        2.0, "Longest a process stays stopped by a receiver's pause_on_load, whatever the agent does "
             "(stopped, hung, starved, killed): a supervisor process resumes it then, and stops are made only "
             "while the agent's poll loops and the supervisor renew their leases (half this time). A process "
             "resumed that way runs untraced until its probes attach; counted in "
             "otel_ebpf.pauses.timed_out (docs/reliability.md, 'The pause guard').", duration=True)
    shutdown_timeout: float = doc(
        60.0, "Longest the agent spends, once tracing stops, handing on what it collected: the pipeline's "
              "backlog, then each exporter's queue (the last metrics get 5s more). What is left then is counted "
              "dropped (reasons shutdown, export_shutdown) and named in the run's summary.", duration=True)

    def validate(self, path: str) -> None:
        if self.health_endpoint:
            parse_host_port(self.health_endpoint, f"{path}.health_endpoint")
        for key, value in (("max_processes", self.max_processes), ("max_queue", self.max_queue)):
            if value < 1:
                raise ConfigError(f"{path}.{key}", f"must be >= 1, got {value}")
        if self.metrics_interval < 0.05:
            raise ConfigError(f"{path}.metrics_interval", "must be at least 50ms")
        if not 1 <= self.shutdown_timeout <= 3600:
            raise ConfigError(f"{path}.shutdown_timeout", f"must be between 1s and 1h, got {self.shutdown_timeout}s")
        if not 0.2 <= self.pause_timeout <= 300:
            raise ConfigError(f"{path}.pause_timeout", f"must be between 200ms and 300s, got {self.pause_timeout}s")


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
