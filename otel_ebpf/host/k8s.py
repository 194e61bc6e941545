"""Kubernetes metadata of a traced process: pod name, namespace, container name, node.

The pod uid and container id come from ``/proc/PID/cgroup`` (:mod:`otel_ebpf.host.processes`); the
names come from, in precedence order:

1. The kubelet's pod list (``GET /pods`` on the node's kubelet, ``https://$NODE_NAME:10250/pods``
   by default when the agent runs in a pod): ``metadata.name`` / ``namespace`` / ``uid``,
   ``spec.nodeName``, and the container name whose ``containerID`` (``containerd://<id>``,
   ``cri-o://<id>``, ``docker://<id>``) equals the process's ``container.id``. The list is
   fetched when a pod uid is not in it, at most once per ``refresh_interval``; at most
   ``max_pods`` pods are kept (the rest counted as
   ``otel_ebpf.events.dropped{receiver=k8s, reason=pod_table_full}``).
2. The process's own downward-API environment, names in :data:`DOWNWARD_ENV` (``POD_NAME``,
   ``POD_NAMESPACE``, ``NODE_NAME``, ``CONTAINER_NAME``, ``POD_UID`` and their ``K8S_`` /
   ``MY_`` spellings), as a pod spec sets them with ``fieldRef``. The process declares these
   itself, like ``OTEL_SERVICE_NAME``: the kubelet's answer wins where there is one, and the
   cgroup's pod uid over ``POD_UID``.

Only a process whose cgroup names a pod gets any ``k8s.*`` attribute: variables such as
``CONTAINER_NAME`` are common outside Kubernetes (docker compose, CI runners), so on their own
they name no pod.
3. ``k8s.node.name``: the agent's own ``NODE_NAME`` (the DaemonSet's ``spec.nodeName``), for a
   process in a pod.

Failures (kubelet unreachable, TLS, HTTP error, bad JSON) log ONE warning naming the URL and the
cause (later ones at debug level, a recovery at info) and are counted in
``otel_ebpf.k8s.kubelet.errors{error}``; attributes then come from the cgroup and environment
only. The service-account token (re-read at every fetch: projected tokens rotate) is only ever
sent over https.

Threading: :class:`K8sMetadata` is shared by every thread that builds resources; one lock
serializes lookups and fetches (a fetch blocks its caller up to ``timeout``, at most once per
``refresh_interval``). :meth:`K8sMetadata.attributes` never raises.
"""
from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.semconv._incubating.attributes.k8s_attributes import (
    K8S_CONTAINER_NAME,
    K8S_NAMESPACE_NAME,
    K8S_NODE_NAME,
    K8S_POD_NAME,
    K8S_POD_UID,
)

from otel_ebpf.core.telemetry import Telemetry

__all__ = ["DOWNWARD_ENV", "DOWNWARD_ENV_NAMES", "KUBELET_ERRORS", "K8sMetadata", "PodInfo", "kubelet_url",
           "parse_pod_list"]

log = logging.getLogger(__name__)

#: attribute -> environment variables of the process, first set one wins.
DOWNWARD_ENV: dict[str, tuple[str, ...]] = {
    K8S_POD_NAME: ("POD_NAME", "K8S_POD_NAME", "MY_POD_NAME"),
    K8S_NAMESPACE_NAME: ("POD_NAMESPACE", "K8S_NAMESPACE", "K8S_POD_NAMESPACE", "MY_POD_NAMESPACE"),
    K8S_NODE_NAME: ("NODE_NAME", "K8S_NODE_NAME", "MY_NODE_NAME"),
    K8S_CONTAINER_NAME: ("CONTAINER_NAME", "K8S_CONTAINER_NAME"),
    K8S_POD_UID: ("POD_UID", "K8S_POD_UID", "MY_POD_UID"),
}
DOWNWARD_ENV_NAMES = frozenset(name for names in DOWNWARD_ENV.values() for name in names)
KUBELET_ERRORS = "otel_ebpf.k8s.kubelet.errors"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_MAX_BODY = 64 * 1024 * 1024
_MAX_VALUE = 256


@dataclass(frozen=True)
class PodInfo:
    """One pod of the kubelet's list. ``containers``: container id (64 hex) -> container name."""

    uid: str
    name: str
    namespace: str
    node: str = ""
    containers: Mapping[str, str] = field(default_factory=dict)


def _text(value: Any) -> str:
    return value[:_MAX_VALUE] if isinstance(value, str) else ""


def parse_pod_list(doc: Any, max_pods: int) -> tuple[dict[str, PodInfo], int]:
    """``v1.PodList`` JSON (as decoded) -> ({pod uid: PodInfo}, pods left out over ``max_pods``).
    Malformed items are skipped; a document that is not a PodList raises ValueError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a PodList (no 'items' list)")
    pods: dict[str, PodInfo] = {}
    skipped = 0
    for item in doc["items"]:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not _text(meta.get("uid")):
            continue
        if len(pods) >= max_pods:
            skipped += 1
            continue
        spec, status = item.get("spec") or {}, item.get("status") or {}
        containers: dict[str, str] = {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or () if isinstance(status, dict) else ():
                cid = _text(cs.get("containerID")).rpartition("://")[2] if isinstance(cs, dict) else ""
                if cid and _text(cs.get("name")):
                    containers[cid] = _text(cs.get("name"))
        uid = _text(meta["uid"])
        pods[uid] = PodInfo(uid, _text(meta.get("name")), _text(meta.get("namespace")),
                            _text(spec.get("nodeName")) if isinstance(spec, dict) else "", containers)
    return pods, skipped


def kubelet_url(setting: str, agent_env: Mapping[str, str], token_file: str = TOKEN_FILE) -> str | None:
    """The pod-list URL for config value ``setting`` (``auto``, ``off`` or a URL): ``auto`` is
    ``https://$NODE_NAME:10250/pods`` when the agent runs in a pod (KUBERNETES_SERVICE_HOST and
    NODE_NAME set, a service-account token present), else None (no kubelet)."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting
    node = agent_env.get("NODE_NAME", "").strip()
    if agent_env.get("KUBERNETES_SERVICE_HOST") and node and os.path.exists(token_file):
        return f"https://{node}:10250/pods"
    return None


def _downward(env: Mapping[str, str]) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for attr, names in DOWNWARD_ENV.items():
        value = next((env[n].strip() for n in names if env.get(n, "").strip()), "")
        if value:
            attrs[attr] = value[:_MAX_VALUE]
    return attrs


class K8sMetadata:
    """``k8s.*`` resource attributes for a process (see the module docstring).

    ``config`` is a :class:`otel_ebpf.core.config.K8sConfig`; ``agent_env`` the agent's environment
    (``NODE_NAME``, ``KUBERNETES_SERVICE_HOST``); ``fetch(url) -> bytes`` replaces the HTTP GET in
    tests that need no server."""

    def __init__(self, config: Any, telemetry: Telemetry | None = None, *,
                 agent_env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic,
                 fetch: Callable[[str], bytes] | None = None) -> None:
        self.config = config
        env = os.environ if agent_env is None else agent_env
        self.url = kubelet_url(config.kubelet_url, env, config.token_file) if config.enabled else None
        self.node = env.get("NODE_NAME", "").strip()[:_MAX_VALUE]
        self._telemetry = telemetry or Telemetry()
        self._clock = clock
        self._fetch = fetch or self._get
        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._fetched_at = float("-inf")
        self._failing = False
        self._warned = False
        self.fetches = 0

    def attributes(self, pod_uid: str | None, container_id: str | None,
                   env: Mapping[str, str]) -> dict[str, str]:
        """k8s.* attributes of a process in pod ``pod_uid`` (from its cgroup) with downward-API
        ``env``; none at all when ``pod_uid`` is None (not in a pod as far as the cgroup tells: a
        ``CONTAINER_NAME`` or ``POD_NAME`` in a host process's environment names no pod). Never raises."""
        if not self.config.enabled or not pod_uid:
            return {}
        attrs = _downward(env)
        attrs[K8S_POD_UID] = pod_uid
        pod = self._pod(pod_uid)
        if pod is not None:
            for key, value in ((K8S_POD_NAME, pod.name), (K8S_NAMESPACE_NAME, pod.namespace),
                               (K8S_NODE_NAME, pod.node), (K8S_CONTAINER_NAME, pod.containers.get(container_id or ""))):
                if value:
                    attrs[key] = value
        if K8S_NODE_NAME not in attrs and self.node:
            attrs[K8S_NODE_NAME] = self.node
        return attrs

    def _pod(self, uid: str) -> PodInfo | None:
        if self.url is None:
            return None
        with self._lock:
            pod = self._pods.get(uid) or self._pods.get(uid.replace("_", "-"))
            now = self._clock()
            if pod is None and now - self._fetched_at >= self.config.refresh_interval:
                self._fetched_at = now
                self._refresh(self.url)
                pod = self._pods.get(uid) or self._pods.get(uid.replace("_", "-"))
        return pod

    def _refresh(self, url: str) -> None:
        self.fetches += 1
        try:
            pods, skipped = parse_pod_list(json.loads(self._fetch(url)), self.config.max_pods)
        except Exception as exc:  # unreachable, TLS, HTTP status, JSON: one warning, counted
            self._failed(url, exc)
            return
        self._pods = pods
        if skipped:
            self._telemetry.dropped("k8s", "pod_table_full", skipped)
        if self._failing:
            log.info("kubelet pod list at %s is readable again (%d pods)", url, len(pods))
        self._failing = False

    def _failed(self, url: str, exc: Exception) -> None:
        self._telemetry.add(KUBELET_ERRORS, 1, error=type(exc).__name__)
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = self._failing = True
        log.log(level, "kubelet pod list unavailable at %s: %s: %s; k8s.* attributes come from the cgroup and "
                       "the process environment only (service.k8s.kubelet_url)", url, type(exc).__name__, exc)

    def _get(self, url: str) -> bytes:
        headers = {"Accept": "application/json"}
        context = None
        if url.startswith("https://"):
            token = self._token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            if self.config.insecure_skip_verify:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:  # a missing CA file fails the fetch (counted), it does not fall back to no checks
                context = ssl.create_default_context(cafile=self.config.ca_file or None)
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=self.config.timeout, context=context) as response:
            body: bytes = response.read(_MAX_BODY + 1)
        if len(body) > _MAX_BODY:
            raise ValueError(f"pod list larger than {_MAX_BODY} bytes")
        return body

    def _token(self) -> str:
        try:
            with open(self.config.token_file, encoding="utf-8") as fh:
                return fh.read(64 * 1024).strip()
        except OSError:
            return ""
