"""Liveness and readiness over HTTP, for the agent and the gateway (Kubernetes probes, compose healthchecks).

::

    GET /healthz   200 while every started thread (receiver poll loops, pipeline workers) is alive;
                   503 when one has died: the process should be restarted.
    GET /readyz    200 once every receiver has started (probes attached, poll thread running) and no
                   pipeline queue is stuck; 503 otherwise. Both answer a JSON body naming each
                   component, its state and, when not ready, why.

Anything else is 404. There is no ``/metrics`` here: the ``prometheus`` exporter serves those.

The endpoint is ``service.health_endpoint`` (default ``127.0.0.1:13133`` for the agent, like the
Collector's health_check extension; ``127.0.0.1:13134`` for the gateway, so both fit on one host;
``""`` disables it). Binding loopback by default keeps it off the network: a Kubernetes DaemonSet
sets ``0.0.0.0:13133`` (see ``deploy/k8s``). When the *default* address is taken (a second
``otel-ebpf run`` on the same host) the agent logs it (info: two traced commands side by side are
normal) and runs without it; an address set explicitly must bind, or :class:`HealthBindError` names it.

How a component is judged, without the components depending on this module (duck typing):
a ``health()`` method returning ``(alive, ready, detail)`` wins; else a receiver with a truthy
``disabled`` (the nvml receiver without a driver) is ready and says why it is off; else its
``_thread`` (BpfReceiver, NvmlReceiver: the poll thread) is None before start (not ready) and
must stay alive; else a ``_started`` flag (the gateway's OTLP receiver, which binds in start) is
read. A queue is stuck when events wait and its worker has handed on no batch for ``stuck_after``
seconds (:attr:`otel_ebpf.core.pipeline.BoundedQueue.progress`).

Thread safety: requests run on the server's threads and only read component state; the server
holds at most ``_MAX_CLIENTS`` connections at once (more wait in the listen backlog).
"""
from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_ebpf.bpf import pauseguard
from otel_ebpf.core.config import parse_host_port
from otel_ebpf.core.errors import OtelEbpfError

__all__ = ["AGENT_DEFAULT", "GATEWAY_DEFAULT", "Check", "HealthBindError", "HealthServer", "agent_checks",
           "evaluate", "gateway_checks", "serve"]

log = logging.getLogger(__name__)

AGENT_DEFAULT = "127.0.0.1:13133"
GATEWAY_DEFAULT = "127.0.0.1:13134"
_MAX_CLIENTS = 4


class HealthBindError(OtelEbpfError):
    """The health endpoint could not be bound; the message names the address."""


@dataclass(frozen=True)
class Check:
    """One component's state: ``alive`` false means restart me; ``ready`` false means do not send work yet."""

    component: str
    alive: bool
    ready: bool
    detail: str


# ---- judging components ------------------------------------------------------------------------------
def receiver_check(name: str, r: Any) -> Check:
    fn = getattr(r, "health", None)
    if callable(fn):
        alive, ready, detail = fn()
        return Check(name, bool(alive), bool(ready), str(detail))
    disabled = getattr(r, "disabled", None)
    if disabled:
        return Check(name, True, True, f"disabled: {disabled}")
    if hasattr(r, "_thread"):
        thread = r._thread
        if thread is None:
            return Check(name, True, False, "not started")
        if not thread.is_alive():
            return Check(name, False, False, "poll thread exited (see the agent log)")
        return Check(name, True, True, "running")
    if hasattr(r, "_started"):
        return Check(name, True, bool(r._started), "running" if r._started else "not started")
    return Check(name, True, True, "no state to check")


class _QueueWatch:
    """Remembers when each queue last handed a batch on, to tell a stuck worker from a busy one."""

    def __init__(self, stuck_after: float) -> None:
        self.stuck_after = stuck_after
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[int, float]] = {}  # id(queue) -> (batches done, when that changed)

    def check(self, name: str, q: Any) -> Check:
        waiting, done, worker = q.progress
        now = time.monotonic()
        with self._lock:
            last, since = self._seen.get(id(q), (-1, now))
            if done != last:
                since = now
            self._seen[id(q)] = (done, since)
        if worker != "running":
            return Check(name, worker == "not started", False, f"worker {worker}")
        if waiting and now - since > self.stuck_after:
            return Check(name, True, False, f"stuck: {waiting} events waiting, no batch handed on for "
                                            f"{now - since:.0f}s")
        return Check(name, True, True, f"{waiting} events waiting")


def agent_checks(agent: Any, stuck_after: float = 30.0) -> Callable[[], list[Check]]:
    """The checks of an :class:`otel_ebpf.service.agent.Agent`: its receivers and each pipeline's queue."""
    watch = _QueueWatch(stuck_after)

    def run() -> list[Check]:
        out = [receiver_check(f"receiver/{rid}", r) for rid, r in agent.receivers.items()]
        out += [watch.check(f"pipeline/{p.name}", p.queue) for p in agent.pipelines]
        guard = pauseguard.health(agent.ctx)
        if guard is not None:  # not ready without its supervisor: pause_on_load is then off
            out.append(Check("pause_guard", True, guard[0], guard[1]))
        return out
    return run


def gateway_checks(gateway: Any, stuck_after: float = 30.0) -> Callable[[], list[Check]]:
    """The checks of an :class:`otel_ebpf.gateway.Gateway`: its OTLP receivers and both queues."""
    watch = _QueueWatch(stuck_after)

    def run() -> list[Check]:
        out = [receiver_check(f"receiver/{rid}", r) for rid, r in gateway.receivers.items()]
        out += [watch.check("queue/traces", gateway.traces), watch.check("queue/metrics", gateway.metrics)]
        return out
    return run


def evaluate(checks: Iterable[Check], want: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) for ``want`` = ``"alive"`` or ``"ready"``."""
    rows = list(checks)
    ok = all(getattr(c, want) for c in rows)
    failing = [c.component for c in rows if not getattr(c, want)]
    body = {"status": ("alive" if want == "alive" else "ready") if ok else f"not {want}",
            "failing": failing, "components": [asdict(c) for c in rows]}
    return (200 if ok else 503), body


# ---- the HTTP server ---------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_port = False  # a taken port must fail, not be shared
    request_queue_size = 16

    def __init__(self, host: str, port: int, checks: Callable[[], list[Check]]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.checks = checks
        self.slots = threading.BoundedSemaphore(_MAX_CLIENTS)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 5.0  # a stalled client cannot hold a slot for long

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        want = {"/healthz": "alive", "/readyz": "ready"}.get(path)
        if want is None:
            return self._send(404, {"error": f"no such path {path!r}; try /healthz or /readyz"})
        try:
            status, body = evaluate(self.server.checks(), want)
        except Exception as exc:  # a failing check is itself a finding, never a dead server
            log.debug("health check failed", exc_info=True)
            status, body = 503, {"status": f"not {want}", "error": f"check failed: {exc}"}
        self._send(status, body)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health %s: " + format, self.address_string(), *args)


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` on a daemon thread. Binds in the constructor (port 0: any
    free port, see :attr:`port`). ``shutdown`` is safe twice."""

    def __init__(self, host: str, port: int, checks: Callable[[], list[Check]]) -> None:
        self._server: _Server | None = _Server(host, port, checks)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="otel-ebpf-health", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5)


def serve(endpoint: str, default: str, checks: Callable[[], list[Check]], path: str) -> HealthServer | None:
    """Start serving ``endpoint`` (None when it is ""). A taken *default* address is a warning
    (another agent on this host has it); any other bind failure raises HealthBindError naming
    the address and the config key ``path``."""
    if not endpoint:
        return None
    host, port = parse_host_port(endpoint, path)
    try:
        server = HealthServer(host, port, checks)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if endpoint == default and exc.errno == errno.EADDRINUSE:
            log.info("health endpoint %s not served: %s (another otel-ebpf on this host?); set %s to "
                        "another address, or '' to disable it", endpoint, why, path)
            return None
        raise HealthBindError(f"cannot serve the health endpoint on {endpoint} ({path}): {why}",
                              hint=f"set {path} to a free HOST:PORT, or '' to disable it") from None
    log.info("health endpoint on http://%s (/healthz, /readyz)", server.address)
    return server
