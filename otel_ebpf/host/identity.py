"""The host's attributes and the otel-ebpf services' own resources (agent, gateway).

Computed once per process (host name, architecture, kernel release), cleaned like every value
read from the host (:func:`otel_ebpf.host.attributes.clean`). Thread-safe.
"""
from __future__ import annotations

import functools
import platform
import socket

from opentelemetry.semconv._incubating.attributes import host_attributes as _host
from opentelemetry.semconv._incubating.attributes import os_attributes as _os
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION

from otel_ebpf.core.version import __version__
from otel_ebpf.host.attributes import Attributes, clean as _clean

__all__ = ["agent_resource_attributes", "gateway_resource_attributes", "host_attributes"]

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm32",
         "ppc64le": "ppc64", "ppc64": "ppc64", "s390x": "s390x", "i386": "x86", "i686": "x86"}


@functools.lru_cache(maxsize=1)
def _host_attributes() -> tuple[tuple[str, str], ...]:
    machine = platform.machine()
    return ((_host.HOST_NAME, _clean(socket.gethostname())),
            (_host.HOST_ARCH, _ARCH.get(machine.lower(), _clean(machine))),
            (_os.OS_TYPE, platform.system().lower() or "linux"),
            (_os.OS_DESCRIPTION, _clean(platform.release())))


def host_attributes() -> Attributes:
    """host.name, host.arch, os.type, os.description (kernel release) of the agent's host.

    Computed once per agent process; returns a fresh dict the caller may mutate.
    """
    return dict(_host_attributes())


def agent_resource_attributes() -> Attributes:
    """The agent's own resource: service.name ``otel-ebpf``, service.version and host attributes.

    ``telemetry.sdk.*`` are left to the SDK's ``Resource.create``.
    """
    return {SERVICE_NAME: "otel-ebpf", SERVICE_VERSION: __version__, **host_attributes()}


def gateway_resource_attributes() -> Attributes:
    """The gateway's own resource (its metrics, and collective root spans it synthesizes)."""
    return {SERVICE_NAME: "otel-ebpf-gateway", SERVICE_VERSION: __version__, **host_attributes()}


