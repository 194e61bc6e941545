"""Security defaults: every server the project runs listens on loopback unless configured
otherwise, and secrets in a traced command line or its environment never reach the output.

The refusal of a world-writable config is tests/e2e/test_cli.py::test_world_writable_config_is_refused;
user-declared probes not injecting C is the probes receiver's own suite.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import subprocess
import sys
import time

import psutil
import pytest

from otel_ebpf.emit.exporters import PrometheusExporterConfig, build_exporters
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.gateway import Gateway
from otel_ebpf.gateway import config as gateway_config
from tests.faults.agentproc import ROOT, wait_until
from tests.support.otlp_sink import spans_from_jsonl

SECRETS = {"--password=": "hunter2pw", "--api-key": "k3ysekret", "url": "pa55w0rdurl",
           "AWS_SECRET_ACCESS_KEY=": "awsargs3cr3t", "env": "awsenvs3cr3t", "--token": "tok3nvalue"}


def _listening(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # grpcio binds 127.0.0.1 as ::ffff:127.0.0.1
    return (mapped or addr).is_loopback


def _all_loopback(addrs: set[tuple[str, int]]) -> bool:
    return all(_is_loopback(ip) for ip, _ in addrs)


def _with_port_zero(endpoint: str) -> str:
    host, _, _ = endpoint.rpartition(":")
    return f"{host}:0"


def test_gateway_defaults_listen_on_loopback_only(tmp_path):
    cfg = gateway_config.load()
    rid = next(iter(cfg.receivers))
    rcfg = cfg.receivers[rid]
    # the default hosts, with port 0 so this test never collides with a running gateway
    cfg.receivers[rid] = dataclasses.replace(rcfg, grpc_endpoint=_with_port_zero(rcfg.grpc_endpoint),
                                             http_endpoint=_with_port_zero(rcfg.http_endpoint))
    if getattr(cfg.service, "health_endpoint", ""):
        cfg.service.health_endpoint = _with_port_zero(cfg.service.health_endpoint)
    for eid, e in cfg.exporters.items():
        if hasattr(e, "directory"):
            cfg.exporters[eid] = dataclasses.replace(e, directory=str(tmp_path))
    before = _listening(os.getpid())
    gw = Gateway(cfg)
    gw.start()
    try:
        new = _listening(os.getpid()) - before
        assert len(new) >= 2, new  # gRPC and HTTP at least
        assert _all_loopback(new), new
    finally:
        gw.shutdown()


def test_prometheus_exporter_default_is_loopback_and_refuses_others():
    default = PrometheusExporterConfig()
    default.validate("exporters.prometheus")
    before = _listening(os.getpid())
    _, metrics = build_exporters(dataclasses.replace(default, endpoint=_with_port_zero(default.endpoint)))
    try:
        new = _listening(os.getpid()) - before
        assert new and _all_loopback(new), new
    finally:
        metrics.shutdown()
    with pytest.raises(ConfigError, match="not a loopback"):
        PrometheusExporterConfig(endpoint="0.0.0.0:9435").validate("exporters.prometheus")


@pytest.mark.bpf
def test_agent_servers_listen_on_loopback_only(bpf_ready, tmp_path):
    """The agent's health endpoint and a Prometheus exporter at their default hosts (ports 0: never
    collide with another agent on the host): every socket the agent listens on is loopback."""
    from otel_ebpf.core.config import ServiceConfig

    health_host = ServiceConfig().health_endpoint.rpartition(":")[0]
    prom = _with_port_zero(PrometheusExporterConfig().endpoint)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"exporters:\n  file:\n    directory: {tmp_path / 'out'}\n  prometheus:\n    endpoint: '{prom}'\n"
                   f"service:\n  health_endpoint: '{health_host}:0'\n"
                   "  pipelines:\n    default:\n      exporters: [file, prometheus]\n")
    cfg.chmod(0o600)
    p = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config", str(cfg), "--", "sleep", "6"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: set[tuple[str, int]] = set()
    try:
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            try:
                seen |= _listening(p.pid)
            except psutil.Error:
                break
            time.sleep(0.2)
    finally:
        _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert len(seen) >= 2, seen  # health and Prometheus
    assert _all_loopback(seen), seen


@pytest.mark.bpf
def test_secrets_in_argv_and_environment_never_reach_the_output(bpf_ready, cudart, tmp_path):
    s = SECRETS
    argv = [f"--password={s['--password=']}", "--api-key", s["--api-key"], f"https://user:{s['url']}@host/x",
            f"AWS_SECRET_ACCESS_KEY={s['AWS_SECRET_ACCESS_KEY=']}", "--token", s["--token"]]
    code = f"import ctypes; rt = ctypes.CDLL({str(cudart)!r}); [rt.cudaMemcpy(None, None, 8, 1) for _ in range(5)]"
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": s["env"], "HF_TOKEN": s["env"]}
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(tmp_path / "out"), "--",
                        sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert wait_until(lambda: (tmp_path / "out" / "traces.jsonl").exists(), 5)
    text = "".join(f.read_text() for f in (tmp_path / "out").iterdir()) + r.stderr
    assert "cudaMemcpy" in text and "<redacted>" in text
    # the lifecycle receiver (on by default) exported the command's process span and its exec event, whose
    # argv the kernel read from the process's memory: they are covered too (issue 18)
    assert "otel_ebpf.lifecycle" in text and '"process.exec"' in text
    leaked = [name for name, secret in s.items() if secret in text]
    assert not leaked, f"secrets leaked: {leaked}"


@pytest.mark.bpf
def test_secrets_in_the_argv_of_processes_gone_before_proc_is_read_never_reach_the_output(bpf_ready, tmp_path):
    # /bin/true exits at once: most of their resources come from the argv the kernel read at exec
    # (ResourceCache.hint), not from /proc; that copy is redacted as /proc's is
    s = SECRETS
    args = (f"--password={s['--password=']} --api-key {s['--api-key']} https://user:{s['url']}@host/x "
            f"AWS_SECRET_ACCESS_KEY={s['AWS_SECRET_ACCESS_KEY=']} --token {s['--token']}")
    script = f"for i in $(seq 20); do /bin/true {args}; done"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_")}
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(tmp_path / "out"), "--",
                        "sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    text = "".join(f.read_text() for f in (tmp_path / "out").iterdir()) + r.stderr
    rows = spans_from_jsonl(tmp_path / "out" / "traces.jsonl")
    trues = [res for res, _, span in rows if span.name == "process true"]
    assert len(trues) == 20
    assert all(res.get("process.command_line", "").startswith("/bin/true --password=<redacted> --api-key <redacted>")
               for res in trues), trues
    leaked = [name for name, secret in s.items() if secret in text]
    assert not leaked, f"secrets leaked: {leaked}"
