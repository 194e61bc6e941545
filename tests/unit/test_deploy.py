"""What can be validated of deploy/ on this machine, without Docker or a cluster.

* every YAML and JSON file parses; the Dockerfile copies only what exists;
* Prometheus: ``promtool check rules`` / ``check config`` and ``promtool test rules`` firing every
  alert from synthetic series (Debian's prometheus package; in CI a missing promtool FAILS);
* the agent and gateway configs (files and the k8s ConfigMaps) load with otel-ebpf's own loaders;
* compose: against the compose-spec JSON schema shipped in Docker's docker-compose 1.29.2 wheel
  (downloaded at set-up by tests/support/compose_schema.py, never vendored; in CI a missing one FAILS);
* Kubernetes: every manifest in deploy/ against the models of the official ``kubernetes`` client
  (generated from the Kubernetes OpenAPI spec; tests/support/k8s_schema.py), the kustomization's
  resources, and the cross-references between objects;
* the Grafana dashboard and the alerts use only metric names otel-ebpf exports: names scraped
  from a REAL agent's Prometheus endpoint (nvml receiver on the stand-in libnvidia-ml.so.1,
  tests/support/stand_in_nvml.c) plus the metric catalogs of every receiver and processor,
  translated by the real exporter; the scraped ones must all be in the catalog.
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "otel-ebpf.json"


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in k8s_docs() if d["kind"] == kind]


# ---- parse -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


def test_dockerfile_copies_what_exists_and_runs_the_node_agent() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    sources = [s for line in text.splitlines() if line.startswith("COPY ") for s in line.split()[1:-1]]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    ignored = [ln for ln in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if ln and ln[0] != "#"]
    assert not [s for s in sources if any(Path(s).match(pat) or s.split("/")[0] == pat for pat in ignored)]
    assert 'ENTRYPOINT ["otel-ebpf"]' in text
    assert 'CMD ["run", "--all-processes", "--config", "/etc/otel-ebpf/agent.yaml"]' in text
    assert "python3-bpfcc" in text and "--system-site-packages" in text


# ---- prometheus --------------------------------------------------------------------------------------
@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool (Debian's prometheus package) must be installed in CI (scripts/setup.sh)")
        pytest.skip("needs promtool from Debian's prometheus package (scripts/setup.sh installs it)")
    return path


def run(cmd: list[str], cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_alert_rules_pass_promtool(promtool: str) -> None:
    r = run([promtool, "check", "rules", "alerts.yaml"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_fires_in_promtool_unit_tests(promtool: str) -> None:
    r = run([promtool, "test", "rules", "alerts_test.yaml"])
    assert r.returncode == 0, r.stdout + r.stderr
    alerts = {rule["alert"]: rule for g in yaml.safe_load((PROM / "alerts.yaml").read_text())["groups"]
              for rule in g["rules"]}
    tested = {case["alertname"] for t in yaml.safe_load((PROM / "alerts_test.yaml").read_text())["tests"]
              for case in t["alert_rule_test"] if case["exp_alerts"]}
    assert set(alerts) == tested
    assert {"GpuEccUncorrectedErrors", "GpuXidCritical", "ProcessOomKilled", "NcclDesync", "NcclStragglerRate",
            "OtelEbpfDroppingEvents", "OtelEbpfAgentDown"} <= set(alerts)
    assert alerts["OtelEbpfAgentDown"]["expr"] == 'up{job="otel-ebpf-agent"} == 0'
    assert all(rule["annotations"].get("runbook") for rule in alerts.values())


def test_compose_prometheus_config_passes_promtool(promtool: str) -> None:
    r = run([promtool, "check", "config", "prometheus.yml"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_scrape_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    """Debian builds Prometheus without Kubernetes discovery, so its promtool rejects
    ``kubernetes_sd_configs``; the rest (relabelling, regexes, rule files) is checked with static
    targets in their place."""
    cfg = yaml.safe_load((PROM / "kubernetes.yml").read_text())
    jobs = cfg["scrape_configs"]
    assert {j["job_name"] for j in jobs} >= {"otel-ebpf-agent", "otel-ebpf-gateway"}
    for job in jobs:
        assert [sd["role"] for sd in job.pop("kubernetes_sd_configs")] == ["pod"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9435"]}]
    (tmp_path / "kubernetes.yml").write_text(yaml.safe_dump(cfg))
    shutil.copy(PROM / "alerts.yaml", tmp_path / "alerts.yaml")
    r = run([promtool, "check", "config", "kubernetes.yml"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- the otel-ebpf configs ---------------------------------------------------------------------------
def _load_agent(text: str, tmp_path: Path) -> Any:
    from otel_ebpf.service import settings
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return settings.load(str(path))


def _load_gateway(text: str, tmp_path: Path) -> Any:
    from otel_ebpf.gateway import config

    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return config.load(str(path))


def configmap(name: str) -> dict[str, str]:
    [cm] = [d for d in by_kind("ConfigMap") if d["metadata"]["name"] == name]
    return cm["data"]


def test_agent_and_gateway_configs_load_with_otel_ebpfs_own_loaders(tmp_path: Path) -> None:
    for text in ((DEPLOY / "config" / "agent.yaml").read_text(), configmap("otel-ebpf-agent")["agent.yaml"]):
        cfg = _load_agent(text, tmp_path)
        assert cfg.service.health_endpoint == "0.0.0.0:13133"
        assert cfg.service.pipelines["default"].exporters == ["otlp", "prometheus"]
        assert cfg.exporters["prometheus"].endpoint == "0.0.0.0:9435"
    for text in ((DEPLOY / "config" / "gateway.yaml").read_text(), configmap("otel-ebpf-gateway")["gateway.yaml"]):
        gw = _load_gateway(text, tmp_path)
        assert gw.service.health_endpoint == "0.0.0.0:13134"
        assert gw.pipeline.processors == ["collective_join"]
        assert gw.receivers["otlp"].grpc_endpoint == "0.0.0.0:4327"


# ---- compose -----------------------------------------------------------------------------------------
# Validated against the compose-spec JSON schema (test_compose_file_matches_the_compose_spec_schema);
# on top of it: every service key is one of these (what this deployment is meant to use), and every
# reference resolves.
_COMPOSE_SERVICE_KEYS = {"image", "build", "command", "entrypoint", "pid", "cap_add", "cap_drop", "security_opt",
                         "volumes", "environment", "restart", "depends_on", "healthcheck", "ports", "privileged",
                         "network_mode", "devices", "deploy"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())


def test_compose_services_are_wired_together() -> None:
    doc = compose()
    services = doc["services"]
    assert set(services) == {"agent", "gateway", "otelcol", "jaeger", "tempo", "prometheus", "grafana"}
    assert set(doc) <= {"name", "services", "volumes", "networks", "configs", "secrets"} | {
        k for k in doc if k.startswith("x-")}
    for name, svc in services.items():
        assert set(svc) <= _COMPOSE_SERVICE_KEYS, (name, set(svc) - _COMPOSE_SERVICE_KEYS)
        assert "image" in svc, name
        for dep in svc.get("depends_on", []):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), (name, src)
            elif not src.startswith("/"):
                assert src in doc["volumes"], (name, src)
    agent = services["agent"]
    assert agent["pid"] == "host" and {"BPF", "PERFMON", "SYS_ADMIN"} <= set(agent["cap_add"])
    assert {"/sys/kernel/tracing", "/sys/fs/bpf", "/lib/modules"} <= {v.split(":")[0] for v in agent["volumes"]}
    assert agent["build"]["dockerfile"] == "deploy/Dockerfile" and (DEPLOY / ".." / agent["build"]["context"]).is_dir()


def test_compose_endpoints_match_the_configs_that_serve_them() -> None:
    services = compose()["services"]
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom["scrape_configs"]}
    assert targets["otel-ebpf-agent"] == ["agent:9435"] and targets["otel-ebpf-gateway"] == ["gateway:9436"]
    for hostport in (t for ts in targets.values() for t in ts):
        assert hostport.split(":")[0] in services or hostport.startswith("localhost:")
    otelcol = yaml.safe_load((DEPLOY / "otelcol" / "config.yaml").read_text())
    lb = otelcol["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID" and lb["resolver"]["static"]["hostnames"] == ["gateway:4327"]
    assert otelcol["exporters"]["otlp/jaeger"]["endpoint"].split(":")[0] in services
    assert otelcol["exporters"]["otlp/tempo"]["endpoint"].split(":")[0] in services
    agent_cfg = yaml.safe_load((DEPLOY / "config" / "agent.yaml").read_text())
    assert agent_cfg["exporters"]["otlp"]["endpoint"] == "http://otelcol:4317"
    gw_cfg = yaml.safe_load((DEPLOY / "config" / "gateway.yaml").read_text())
    assert gw_cfg["exporters"]["otlp"]["endpoint"] == "http://otelcol:4319"
    joined = otelcol["receivers"]["otlp/joined"]["protocols"]["grpc"]["endpoint"]
    assert joined.endswith(":4319")
    pipes = otelcol["service"]["pipelines"]
    assert pipes["traces/in"]["exporters"] == ["loadbalancing"]  # gateways' output never loops back
    assert "otlp/joined" not in pipes["traces/in"]["receivers"]
    for pipe in pipes.values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipe.get(kind, [])) <= set(otelcol[kind]), pipe
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/datasources.yaml").read_text())
    urls = {d["uid"]: d["url"] for d in datasources["datasources"]}
    assert {u.split("//")[1].split(":")[0] for u in urls.values()} <= set(services)


@pytest.fixture
def compose_spec() -> dict[str, Any]:
    from tests.support import compose_schema

    schema = compose_schema.load()
    if schema is None:
        why = f"the compose-spec schema ({compose_schema.REQUIREMENT}) is not in {compose_schema.CACHE}"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: scripts/setup.sh must fetch it in CI")
        pytest.skip(f"{why}: run .venv/bin/python -m tests.support.compose_schema --fetch")
    return schema


def test_compose_file_matches_the_compose_spec_schema(compose_spec: dict[str, Any]) -> None:
    from tests.support.compose_schema import validate

    assert validate(compose(), compose_spec) == []


def test_compose_schema_check_names_each_fault(compose_spec: dict[str, Any]) -> None:
    from tests.support.compose_schema import validate

    doc = compose()
    doc["name"] = "OTel eBPF"
    doc["services"]["agent"]["cap_addd"] = doc["services"]["agent"].pop("cap_add")
    doc["services"]["gateway"]["healthcheck"]["interval"] = 15
    doc["services"]["prometheus"]["ports"] = "9090:9090"
    found = validate(doc, compose_spec)
    assert found[0].startswith("name: 'OTel eBPF' is not a valid project name")
    assert any(f.startswith("services.agent: ") and "'cap_addd'" in f for f in found), found
    assert "services.gateway.healthcheck.interval: 15 is not of type 'string'" in found
    assert any(f.startswith("services.prometheus.ports: ") for f in found), found
    assert len(found) == 4, found


# ---- kubernetes --------------------------------------------------------------------------------------
# Every field and type is checked against the kubernetes client's models (test_k8s_manifests_match_*);
# here: the apiVersion each kind is meant to use, names, and that every reference (ConfigMaps,
# ServiceAccount, probe ports, Services, the resolver's DNS name) resolves.
_API = {"Namespace": "v1", "ServiceAccount": "v1", "ConfigMap": "v1", "Service": "v1", "DaemonSet": "apps/v1",
        "Deployment": "apps/v1", "ClusterRole": "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}


def test_kustomization_lists_every_manifest_with_valid_kinds() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    for d in k8s_docs():
        assert _API.get(d["kind"]) == d["apiVersion"], (d["kind"], d["apiVersion"])
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])
        if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == "otel-ebpf"


def k8s_manifest_files() -> list[Path]:
    """Files in deploy/ with at least one Kubernetes document (string apiVersion and a kind)."""
    def is_k8s(path: Path) -> bool:
        return any(isinstance(d, dict) and isinstance(d.get("apiVersion"), str) and "kind" in d
                   for d in yaml.safe_load_all(path.read_text()))
    return [p for p in yaml_files() if is_k8s(p)]


def test_k8s_manifests_are_found_everywhere_in_deploy() -> None:
    found = {p.relative_to(DEPLOY).as_posix() for p in k8s_manifest_files()}
    assert found >= {f"k8s/{p.name}" for p in K8S.glob("*.yaml")}, found


@pytest.mark.parametrize("path", k8s_manifest_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_k8s_manifests_match_the_kubernetes_client_models(path: Path) -> None:
    from tests.support.k8s_schema import validate_file

    assert validate_file(path, ROOT) == []


_GOOD_DAEMONSET = """\
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: demo, namespace: demo, labels: {app.kubernetes.io/name: demo}}
spec:
  selector: {matchLabels: {app: demo}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      hostPID: true
      containers:
        - name: demo
          image: demo:1
          ports: [{name: health, containerPort: 8080}]
          securityContext: {capabilities: {add: [BPF]}}
          livenessProbe: {httpGet: {path: /healthz, port: health}}
          readinessProbe: {httpGet: {path: /readyz, port: 8080}}
          resources: {requests: {cpu: 100m}}
"""


def _validate_text(text: str, tmp_path: Path) -> list[str]:
    from tests.support.k8s_schema import validate_file

    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return validate_file(path, tmp_path)


def test_k8s_validator_passes_a_good_manifest(tmp_path: Path) -> None:
    assert _validate_text(_GOOD_DAEMONSET, tmp_path) == []


_FIELD_FAULTS = [
    ("capabilities: {add", "capabilites: {add",
     "agent.yaml[1].spec.template.spec.containers[0].securityContext.capabilites: unknown field of "
     "V1SecurityContext (did you mean 'capabilities'?)"),
    ("containerPort: 8080", "containerPort: '8080'",
     "agent.yaml[1].spec.template.spec.containers[0].ports[0].containerPort: expected int, got str '8080'"),
    ("hostPID: true", "hostPID: 1",
     "agent.yaml[1].spec.template.spec.hostPID: expected bool, got int 1"),
    ("port: health}", "port: [health]}",
     "agent.yaml[1].spec.template.spec.containers[0].livenessProbe.httpGet.port: expected an int or a string, "
     "got list"),
    ("- name: demo\n          image", "- image",
     "agent.yaml[1].spec.template.spec.containers[0].name: missing required field of V1Container"),
    ("  selector: {matchLabels: {app: demo}}\n", "",
     "agent.yaml[1].spec.selector: missing required field of V1DaemonSetSpec"),
    ("labels: {app.kubernetes.io/name: demo}", "labels: {app.kubernetes.io/name: 3}",
     "agent.yaml[1].metadata.labels['app.kubernetes.io/name']: expected str, got int 3"),
]
_DOC_FAULTS = [
    ("apiVersion: apps/v1", "apiVersion: batch/v1",
     "agent.yaml[1]: the kubernetes client "),
    ("metadata: {name: demo}", "metadata: {name: demo, namespace: demo}",
     "agent.yaml[0].metadata.namespace: Namespace is cluster-scoped and takes no namespace"),
]


@pytest.mark.parametrize(("old", "new", "finding"), _FIELD_FAULTS + _DOC_FAULTS)
def test_k8s_validator_names_the_file_document_and_key_path(old: str, new: str, finding: str,
                                                             tmp_path: Path) -> None:
    assert _GOOD_DAEMONSET.count(old) == 1, old
    found = _validate_text(_GOOD_DAEMONSET.replace(old, new), tmp_path)
    assert len(found) == 1 and found[0].startswith(finding), found


@pytest.mark.parametrize(("old", "new", "finding"), _FIELD_FAULTS)
def test_k8s_validator_faults_are_faults_for_the_clients_own_model(old: str, new: str, finding: str) -> None:
    """The walk invents no rule: the client's model rejects each field fault it reports."""
    from kubernetes.client import V1DaemonSet

    [_, good] = yaml.safe_load_all(_GOOD_DAEMONSET)
    [_, bad] = yaml.safe_load_all(_GOOD_DAEMONSET.replace(old, new))
    V1DaemonSet.model_validate(good)
    with pytest.raises(ValueError, match="validation error"):
        V1DaemonSet.model_validate(bad)


def test_k8s_validator_checks_kustomization_resources(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text(_GOOD_DAEMONSET.replace("hostPID: true", "hostPID: yes please"))
    kust = tmp_path / "kustomization.yaml"
    kust.write_text("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    "resources: [agent.yaml, missing.yaml]\npatches: []\n")
    from tests.support.k8s_schema import validate_file

    assert validate_file(kust, tmp_path) == [
        "kustomization.yaml[0].patches: kustomization key not validated by tests/support/k8s_schema.py",
        "agent.yaml[1].spec.template.spec.hostPID: expected bool, got str 'yes please'",
        "kustomization.yaml[0].resources[1]: 'missing.yaml' is not a file next to the kustomization",
    ]


def _workloads() -> list[dict[str, Any]]:
    return by_kind("DaemonSet") + by_kind("Deployment")


def test_workload_references_resolve() -> None:
    configmaps = {d["metadata"]["name"] for d in by_kind("ConfigMap")}
    accounts = {d["metadata"]["name"] for d in by_kind("ServiceAccount")}
    for w in _workloads():
        spec = w["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        pod = spec["template"]["spec"]
        assert pod.get("serviceAccountName", "default") in accounts | {"default"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
        for c in pod["containers"]:
            ports = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in ports, (w["metadata"]["name"], probe)
            assert {m["name"] for m in c.get("volumeMounts", [])} <= set(volumes)
    for svc in by_kind("Service"):
        selected = [w for w in _workloads() if svc["spec"]["selector"].items()
                    <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, svc["metadata"]["name"]
        names = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names
    [binding] = by_kind("ClusterRoleBinding")
    assert binding["roleRef"]["name"] in {d["metadata"]["name"] for d in by_kind("ClusterRole")}
    assert [s["name"] for s in binding["subjects"]] == ["otel-ebpf-agent"]


def test_agent_daemonset_has_host_access_and_health_probes_on_its_endpoint(tmp_path: Path) -> None:
    [ds] = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and not pod.get("hostNetwork")
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert {"BPF", "PERFMON", "SYS_ADMIN"} <= set(sc["capabilities"]["add"])
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} >= {
        "/sys/kernel/tracing", "/sys/kernel/debug", "/sys/fs/bpf", "/lib/modules", "/usr/src"}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert env["NODE_NAME"] == "spec.nodeName" and env["POD_NAME"] == "metadata.name"
    health = next(p["containerPort"] for p in c["ports"] if p["name"] == "health")
    cfg = _load_agent(configmap("otel-ebpf-agent")["agent.yaml"], tmp_path)
    assert cfg.service.health_endpoint == f"0.0.0.0:{health}"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    rules = by_kind("ClusterRole")[0]["rules"]
    assert any("nodes/proxy" in r["resources"] and r["verbs"] == ["get"] for r in rules)


def test_collector_routes_traces_to_the_gateways_headless_service() -> None:
    cfg = yaml.safe_load(configmap("otel-ebpf-collector")["config.yaml"])
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    [headless] = [s for s in by_kind("Service") if s["spec"].get("clusterIP") == "None"]
    name, ns = headless["metadata"]["name"], headless["metadata"]["namespace"]
    assert lb["resolver"]["dns"]["hostname"] == f"{name}.{ns}.svc.cluster.local"
    assert int(lb["resolver"]["dns"]["port"]) in {p["port"] for p in headless["spec"]["ports"]}
    agent = yaml.safe_load(configmap("otel-ebpf-agent")["agent.yaml"])
    [collector_svc] = [s for s in by_kind("Service") if s["metadata"]["name"] == "otel-ebpf-collector"]
    assert agent["exporters"]["otlp"]["endpoint"] == "http://otel-ebpf-collector.otel-ebpf.svc.cluster.local:4317"
    assert {4317, 4319} <= {p["port"] for p in collector_svc["spec"]["ports"]}


# ---- metric names: dashboard and alerts against what the agent exports --------------------------------
_KINDS = ("counter", "updown", "gauge", "histogram")


def metric_catalog() -> set[tuple[str, str, str]]:
    """(name, kind, unit) of every metric declared by a receiver, processor or the agent itself."""
    from otel_ebpf import processors, receivers
    from otel_ebpf.core import telemetry
    from otel_ebpf.emit.emitter import QUEUE_METRICS

    found = {(name, "counter", "1") for name in telemetry._DESCRIPTIONS}
    found |= {(name, kind, unit) for name, (kind, unit, _description) in QUEUE_METRICS.items()}
    for pkg in (receivers, processors):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            module = importlib.import_module(info.name)
            for var, value in vars(module).items():
                if isinstance(value, dict):
                    for key, spec in value.items():
                        if not (isinstance(key, str) and "." in key and isinstance(spec, tuple) and spec):
                            continue
                        if spec[0] in _KINDS and len(spec) >= 2:
                            found.add((key, spec[0], spec[1]))
                        elif var.endswith(("METRICS", "COUNTERS")) and len(spec) == 2:  # (unit, description)
                            found.add((key, "counter", spec[0]))
                elif (isinstance(value, tuple) and len(value) == 3 and all(isinstance(v, str) for v in value)
                      and var.endswith(("DURATION", "SKEW")) and "." in value[0]):
                    found.add((value[0], "histogram", value[1]))
    return found


def prometheus_names(catalog: set[tuple[str, str, str]]) -> set[str]:
    """Family and sample names the agent's Prometheus exporter gives these metrics."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_ebpf.emit.prometheus import _LatestCollector

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("catalog")
    for name, kind, unit in catalog:
        if kind == "counter":
            meter.create_counter(name, unit=unit).add(1)
        elif kind == "updown":
            meter.create_up_down_counter(name, unit=unit).add(1)
        elif kind == "histogram":
            meter.create_histogram(name, unit=unit).record(1)
        else:
            meter.create_gauge(name, unit=unit).set(1)
    collector = _LatestCollector([])
    collector.set(reader.get_metrics_data())
    return {n for fam in collector.collect() for n in (fam.name, *(s.name for s in fam.samples))}


def scraped_from_a_real_agent(tmp_path: Path) -> set[str]:
    from tests.support.build import build_stand_in_nvml

    lib = build_stand_in_nvml()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workload = subprocess.Popen(["sleep", "60"])
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(f"count 1\ngpu 0\nproc {workload.pid} 1048576\nxid 79\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({
        "receivers": {"nvml": {"interval": 0.3, "event_wait": 0.1}},
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{port}"}},
        "service": {"metrics_interval": 0.3, "health_endpoint": "", "pipelines": {"default": {
            "receivers": ["nvml"], "processors": ["cuda", "nccl"], "exporters": ["prometheus"]}}}}))
    cfg.chmod(0o600)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STAND_IN_NVML_SCENARIO": str(scenario)}
    agent = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config", str(cfg), "--pid",
                              str(workload.pid)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    page = ""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "hw_errors_total" not in page:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    page = r.read().decode()
            except OSError:
                pass
    finally:
        workload.kill()
        workload.wait()
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, err
    assert "hw_errors_total" in page, page[-2000:]
    return {line.split("{")[0].split()[0] for line in page.splitlines() if line and not line.startswith("#")}


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                 "unless", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (not functions, labels, keywords, strings or durations)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if not m.group(2) and m.group(1).lower() not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_promql_name_extraction() -> None:
    assert promql_metrics('sum by (le, x) (rate(a_b_bucket{y="z(w)"}[5m])) / scalar(sum(c_total)) > 0.5') == {
        "a_b_bucket", "c_total"}
    assert promql_metrics('up{job=~"a|b"} == 0 and on(instance) hw_status offset 5m') == {"up", "hw_status"}


def test_dashboard_loads_with_panels_for_gpu_cuda_nccl_and_agent_health() -> None:
    dash = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert [r.split(" ")[0] for r in rows] == ["GPU", "CUDA", "NCCL", "Workload"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "otel-ebpf"
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["targets"] and all(t["datasource"]["uid"] == "prometheus" for t in p["targets"]), p["title"]
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dashboard_and_alerts_use_only_exported_metric_names(tmp_path: Path) -> None:
    catalog = metric_catalog()
    known = prometheus_names(catalog)
    scraped = scraped_from_a_real_agent(tmp_path)
    assert {"hw_gpu_utilization", "hw_errors_total", "otel_ebpf_events_received_total"} <= scraped
    assert scraped <= known, f"exported but missing from the catalog: {sorted(scraped - known)}"
    alerts = yaml.safe_load((PROM / "alerts.yaml").read_text())
    exprs = dashboard_exprs() + [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    used = set().union(*(promql_metrics(e) for e in exprs))
    assert len(used) >= 25 and "hw_gpu_utilisation" not in known  # the extraction works; misspellings are caught
    unknown = used - known - {"up"}  # up: Prometheus's own series per scrape target
    assert not unknown, f"dashboard/alerts reference metrics otel-ebpf does not export: {sorted(unknown)}"
