"""otel_ebpf.host.k8s: pod names from a real kubelet-shaped server on loopback, the downward API, failures."""
from __future__ import annotations

import http.server
import json
import logging
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.config import K8sConfig, build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.host.k8s import KUBELET_ERRORS, K8sMetadata, kubelet_url, parse_pod_list
from otel_ebpf.host.cgroups import container_id_from_cgroup, pod_uid_from_cgroup
from otel_ebpf.host.processes import ResourceCache
from otel_ebpf.service.settings import AgentConfig
from otel_ebpf.core.telemetry import DROPPED, Telemetry
from tests.unit.host.test_resources import _env, make_proc

DATA = Path(__file__).parent / "data"
PODS = (DATA / "kubelet" / "pods.json").read_bytes()

# cgroup fixture -> (pod name, namespace, container name) in the recorded pod list
EXPECTED = {
    "containerd_k8s_burstable_systemd_v2.txt": ("trainer-0", "ml-team", "trainer"),
    "containerd_k8s_burstable_cgroupfs_v1.txt": ("trainer-0", "ml-team", "trainer"),
    "crio_k8s_burstable_systemd_v2.txt": ("trainer-0", "ml-team", "log-shipper"),
    "containerd_k8s_besteffort_systemd_v1.txt": ("jupyter-alice", "notebooks", "notebook"),
    "containerd_kind_besteffort_systemd_v2.txt": ("jupyter-alice", "notebooks", "notebook"),
    "docker_k8s_besteffort_cgroupfs_v1.txt": ("jupyter-alice", "notebooks", "fetch-data"),
    "crio_k8s_besteffort_systemd_v1.txt": ("jupyter-alice", "notebooks", None),  # not a container of it
    "containerd_k8s_guaranteed_cgroupfs_v2.txt": ("inference-server-5d9c7b6f4-x2x7q", "serving", None),
    "containerd_k8s_guaranteed_systemd_v2.txt": ("inference-server-5d9c7b6f4-x2x7q", "serving", "triton"),
    "containerd_k8s_static_pod_cgroupfs_v1.txt": ("etcd-gpu-node-7", "kube-system", "etcd"),
    "crio_conmon_k8s_burstable_systemd_v2.txt": ("trainer-0", "ml-team", None),  # conmon: no container id
}


class Kubelet:
    """A loopback HTTP(S) server answering GET /pods with ``body`` and ``status``."""

    def __init__(self, body: bytes = PODS, status: int = 200, tls: ssl.SSLContext | None = None) -> None:
        self.body, self.status = body, status
        self.requests: list[dict[str, str]] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                self.send_response(owner.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/pods"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def kubelet() -> Iterator[Kubelet]:
    k = Kubelet()
    yield k
    k.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def metadata(url: str, clock: Clock | None = None, **cfg: Any) -> K8sMetadata:
    config = K8sConfig(kubelet_url=url, **cfg)
    return K8sMetadata(config, Telemetry(), agent_env={"NODE_NAME": "agent-node"}, clock=clock or Clock())


def test_the_recorded_pod_list_parses_and_is_bounded() -> None:
    pods, skipped = parse_pod_list(json.loads(PODS), 1024)
    assert skipped == 0 and len(pods) == 5
    trainer = pods["8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e"]
    assert (trainer.name, trainer.namespace, trainer.node) == ("trainer-0", "ml-team", "gpu-node-7")
    assert sorted(trainer.containers.values()) == ["log-shipper", "trainer"]
    assert pods["9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"].containers == {}  # not started: no container id
    assert len(parse_pod_list(json.loads(PODS), 2)[0]) == 2 and parse_pod_list(json.loads(PODS), 2)[1] == 3
    with pytest.raises(ValueError, match="not a PodList"):
        parse_pod_list({"kind": "Status", "status": "Failure"}, 10)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_names_for_every_recorded_cgroup_come_from_the_kubelet(kubelet: Kubelet, fixture: str) -> None:
    cgroup = (DATA / "cgroup" / fixture).read_text()
    attrs = metadata(kubelet.url).attributes(pod_uid_from_cgroup(cgroup), container_id_from_cgroup(cgroup), {})
    name, namespace, container = EXPECTED[fixture]
    assert attrs["k8s.pod.name"] == name and attrs["k8s.namespace.name"] == namespace
    assert attrs.get("k8s.container.name") == container
    assert attrs["k8s.node.name"] == "gpu-node-7"  # spec.nodeName, not the agent's NODE_NAME
    assert attrs["k8s.pod.uid"] == pod_uid_from_cgroup(cgroup)
    assert [r["path"] for r in kubelet.requests] == ["/pods"]
    assert "authorization" not in kubelet.requests[0]  # never a token over plain http


def test_an_unknown_uid_refetches_at_most_once_per_refresh_interval(kubelet: Kubelet) -> None:
    clock = Clock()
    meta = metadata(kubelet.url, clock, refresh_interval=10.0)
    known = "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e"
    new = "11111111-2222-4333-8444-555555555555"
    assert meta.attributes(known, None, {})["k8s.pod.name"] == "trainer-0"
    assert meta.attributes(known, None, {})["k8s.pod.name"] == "trainer-0"
    assert "k8s.pod.name" not in meta.attributes(new, None, {})  # a new pod, within 10 s: no fetch
    assert meta.fetches == 1
    listed = json.loads(PODS)
    listed["items"][0]["metadata"]["uid"] = new
    kubelet.body = json.dumps(listed).encode()
    clock.now += 10
    assert meta.attributes(new, None, {})["k8s.pod.name"] == "trainer-0"
    assert meta.fetches == 2 and len(kubelet.requests) == 2


def test_the_downward_api_environment_names_a_pod_without_a_kubelet() -> None:
    env = {"POD_NAME": "trainer-3", "POD_NAMESPACE": "ml-team", "CONTAINER_NAME": "trainer", "OTHER": "x"}
    meta = metadata("off")
    uid = "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e"
    assert meta.attributes(uid, None, env) == {"k8s.pod.name": "trainer-3", "k8s.namespace.name": "ml-team",
                                               "k8s.container.name": "trainer", "k8s.pod.uid": uid,
                                               "k8s.node.name": "agent-node"}
    # not in a pod as far as the cgroup says: what the environment declares names no pod
    assert meta.attributes(None, None, {"K8S_POD_NAME": "p", "MY_POD_NAMESPACE": "n"}) == {}
    assert meta.attributes(None, None, {"CONTAINER_NAME": "web", "POD_UID": uid}) == {}
    assert meta.attributes(None, None, {}) == {}
    assert metadata("off", enabled=False).attributes(uid, None, env) == {}


def test_the_kubelet_wins_over_what_the_process_declares(kubelet: Kubelet) -> None:
    env = {"POD_NAME": "not-me", "POD_NAMESPACE": "elsewhere"}
    attrs = metadata(kubelet.url).attributes("5e1a7b3c-9d2f-4e8a-b6c4-1f3d5a7b9c2e", None, env)
    assert (attrs["k8s.pod.name"], attrs["k8s.namespace.name"]) == ("inference-server-5d9c7b6f4-x2x7q", "serving")


@pytest.mark.parametrize(("status", "body", "error"), [
    (403, b'{"kind":"Status","status":"Failure","reason":"Forbidden"}', "HTTPError"),
    (200, b"<html>not json</html>", "JSONDecodeError"),
    (200, b'{"kind":"Status"}', "ValueError"),
])
def test_a_failing_kubelet_warns_once_counts_each_failure_and_keeps_cgroup_attributes(
        status: int, body: bytes, error: str, caplog: pytest.LogCaptureFixture) -> None:
    server = Kubelet(body, status)
    clock = Clock()
    meta = metadata(server.url, clock, refresh_interval=1.0)
    uid = "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e"
    try:
        with caplog.at_level(logging.DEBUG, logger="otel_ebpf.host.k8s"):
            for _ in range(3):
                assert meta.attributes(uid, None, {"POD_NAME": "declared"}) == {
                    "k8s.pod.name": "declared", "k8s.pod.uid": uid, "k8s.node.name": "agent-node"}
                clock.now += 1
    finally:
        server.close()
    assert meta._telemetry.get(KUBELET_ERRORS, error=error) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and server.url in warnings[0] and error in warnings[0]


def test_an_unreachable_kubelet_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    down = Kubelet()
    url = down.url
    down.close()  # nothing listens on that port any more
    meta = metadata(url, timeout=0.5)
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.host.k8s"):
        attrs = meta.attributes("c0ffee00-1234-4abc-8def-0123456789ab", "4e6f", {})
    assert attrs == {"k8s.pod.uid": "c0ffee00-1234-4abc-8def-0123456789ab", "k8s.node.name": "agent-node"}
    assert meta._telemetry.get(KUBELET_ERRORS, error="URLError") == 1
    assert len(caplog.records) == 1 and "kubelet pod list unavailable at " + url in caplog.records[0].getMessage()


def test_the_pod_table_bound_is_counted_as_dropped(kubelet: Kubelet) -> None:
    meta = metadata(kubelet.url, max_pods=2)
    meta.attributes("8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e", None, {})
    assert meta._telemetry.get(DROPPED, receiver="k8s", reason="pod_table_full") == 3


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the loopback kubelet's certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kubelet",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem")], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.mark.parametrize("verify", [True, False])
def test_https_sends_the_service_account_token_and_checks_the_certificate(
        tls_files: tuple[Path, Path], tmp_path: Path, verify: bool) -> None:
    cert, key = tls_files
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = Kubelet(tls=tls)
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.sa-token\n")
    cfg: dict[str, Any] = {"token_file": str(token)}
    cfg.update({"ca_file": str(cert)} if verify else {"insecure_skip_verify": True, "ca_file": str(tmp_path / "none")})
    try:
        attrs = metadata(server.url, **cfg).attributes("a3f1e2d4c5b6a7980f1e2d3c4b5a6978", None, {})
        wrong_ca = metadata(server.url, token_file=str(token), ca_file="/etc/ssl/certs/ca-certificates.crt")
        assert "k8s.pod.name" not in wrong_ca.attributes("a3f1e2d4c5b6a7980f1e2d3c4b5a6978", None, {})
    finally:
        server.close()
    assert attrs["k8s.pod.name"] == "etcd-gpu-node-7"
    assert server.requests[0]["authorization"] == "Bearer eyJhbGciOiJSUzI1NiJ9.sa-token"
    assert wrong_ca._telemetry.get(KUBELET_ERRORS) == 1  # a certificate no CA vouches for is a failure


def test_auto_url_only_inside_a_pod(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "NODE_NAME": "gpu-node-7"}
    assert kubelet_url("auto", in_pod, str(token)) == "https://gpu-node-7:10250/pods"
    assert kubelet_url("auto", in_pod, str(tmp_path / "missing")) is None
    assert kubelet_url("auto", {"NODE_NAME": "gpu-node-7"}, str(token)) is None
    assert kubelet_url("off", in_pod, str(token)) is None
    assert kubelet_url("http://127.0.0.1:10255/pods", {}, str(token)) == "http://127.0.0.1:10255/pods"


@pytest.mark.parametrize(("key", "value"), [("kubelet_url", "ftp://node/pods"), ("refresh_interval", "100ms"),
                                            ("timeout", "2m"), ("max_pods", 0)])
def test_bad_k8s_config_names_its_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build(AgentConfig, {"service": {"k8s": {key: value}}})
    assert info.value.path == f"service.k8s.{key}"


def test_resource_cache_adds_pod_names_to_a_process_in_a_pod(kubelet: Kubelet, tmp_path: Path) -> None:
    cgroup = (DATA / "cgroup" / "containerd_k8s_burstable_systemd_v2.txt").read_text()
    make_proc(tmp_path, 4242, cgroup=cgroup, environ=_env(POD_NAME="declared", CUDA_VISIBLE_DEVICES="1"))
    cache = ResourceCache(proc_root=str(tmp_path), k8s=metadata(kubelet.url))
    attrs = cache.get(4242)
    assert {k: v for k, v in attrs.items() if k.startswith(("k8s.", "container."))} == {
        "k8s.pod.uid": "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e", "k8s.pod.name": "trainer-0",
        "k8s.namespace.name": "ml-team", "k8s.container.name": "trainer", "k8s.node.name": "gpu-node-7",
        "container.id": "d2c7e1f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"}
    assert cache.environment(4242) == ({"POD_NAME": "declared", "CUDA_VISIBLE_DEVICES": "1"}, True)
    assert cache.environment(999) is None
    assert "k8s.pod.name" not in ResourceCache(proc_root=str(tmp_path)).get(4242)  # no K8sMetadata: as before


@pytest.mark.parametrize("fixture", ["host_user_session_v2.txt", "host_slurm_step_v2.txt", "docker_v2.txt",
                                     "podman_rootful_v1.txt"])
def test_container_name_in_the_environment_of_a_process_outside_a_pod_is_no_k8s_attribute(
        fixture: str, tmp_path: Path) -> None:
    """Issue 18: a host (or plain docker) process with CONTAINER_NAME / POD_NAME in its environment
    got k8s.container.name with no pod uid or name. Only a cgroup that names a pod counts."""
    cgroup = (DATA / "cgroup" / fixture).read_text()
    make_proc(tmp_path, 4242, cgroup=cgroup, environ=_env(CONTAINER_NAME="web", POD_NAME="p", CUDA_VISIBLE_DEVICES="1"))
    attrs = ResourceCache(proc_root=str(tmp_path), k8s=metadata("off")).get(4242)
    assert not [k for k in attrs if k.startswith("k8s.")], attrs
    assert attrs["cuda.visible_devices"] == "1"  # the environment was read


def test_container_name_in_the_environment_of_a_process_in_a_pod_is_its_k8s_container_name(tmp_path: Path) -> None:
    cgroup = (DATA / "cgroup" / "containerd_k8s_burstable_systemd_v2.txt").read_text()
    make_proc(tmp_path, 4242, cgroup=cgroup, environ=_env(CONTAINER_NAME="web", POD_NAME="p"))
    attrs = ResourceCache(proc_root=str(tmp_path), k8s=metadata("off")).get(4242)
    assert {k: v for k, v in attrs.items() if k.startswith("k8s.")} == {
        "k8s.container.name": "web", "k8s.pod.name": "p", "k8s.pod.uid": "8f2c4e6a-1b3d-4f5a-9c7e-0d2b4f6a8c1e",
        "k8s.node.name": "agent-node"}
