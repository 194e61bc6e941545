"""Where ``run`` sends its data, as a user runs it: flags next to a config's exporters."""
from __future__ import annotations

import os
import socket
import subprocess
import time
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.otlp_sink import metrics_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.bpf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_ebpf", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_output_flag_adds_the_file_exporter_and_the_configs_prometheus_still_listens(bpf_ready, tmp_path):
    port = _free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{port}"}},
        "service": {"metrics_interval": "1s",
                    "pipelines": {"default": {"receivers": ["memory"], "processors": ["memory"],
                                              "exporters": ["prometheus"]}}}}))
    config.chmod(0o600)
    scrape = tmp_path / "scrape.txt"
    # the command scrapes the agent's /metrics once the agent's own counters are there
    job = ("import time, urllib.request, sys\n"
           "for _ in range(100):\n"
           "    time.sleep(0.1)\n"
           "    try: body = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()\n"
           "    except OSError: continue\n"
           "    if 'otel_ebpf_events_received' in body: break\n"
           "open(sys.argv[2], 'w').write(body)\n")
    out = tmp_path / "out"
    r = _cli("run", "--config", str(config), "--output", str(out), "--",
             sys.executable, "-c", job, f"http://127.0.0.1:{port}/metrics", str(scrape))
    assert r.returncode == 0, r.stderr
    assert "otel_ebpf_events_received" in scrape.read_text()  # the config's prometheus exporter listened
    names = {m.name for _, m in metrics_from_jsonl(out / "metrics.jsonl")}  # and --output's file exporter wrote
    assert "otel_ebpf.events.received" in names
    assert "prometheus -> " in r.stderr and f"file -> {out}" in r.stderr  # the summary names both


def test_unreachable_endpoint_is_said_before_the_job_and_exit_4_names_what_was_lost(bpf_ready, tmp_path):
    port = _free_port()  # nothing listens there
    stamp = tmp_path / "ended"
    r = _cli("run", "--otlp-endpoint", f"http://127.0.0.1:{port}", "--",
             "sh", "-c", f"echo job-started >&2; sleep 1; date +%s.%N > {stamp}; exit 3")
    exited = time.time()
    assert r.returncode == 4, r.stderr
    err = r.stderr
    # said before the command's first output, naming the key and the endpoint
    assert err.index(f"exporters.otlp.endpoint http://127.0.0.1:{port}: Connection refused") < err.index("job-started")
    assert f"exporter otlp -> http://127.0.0.1:{port}: NOTHING DELIVERED, lost " in err
    assert "export_failed" in err and "the command exited 3" in err
    assert "exit 4: exporter otlp delivered nothing (the command's own exit code: 3)" in err
    assert "opentelemetry.exporter" not in err  # the SDK's per-attempt lines are folded into ours
    assert err.count("otel_ebpf.emit.sdklog") <= 3  # at most one per failure kind
    # shutdown does not wait for an endpoint known to be down (was 65 s: service.shutdown_timeout, 60 s)
    assert exited - float(stamp.read_text()) < 10.0


def test_an_endpoint_that_takes_only_traces_is_one_line_and_a_summary_of_the_lost_metrics(bpf_ready):
    """As Phoenix's OTLP/gRPC server: the trace service only, so metric exports get UNIMPLEMENTED."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: list[int] = []

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            got.append(sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        workload = [sys.executable, str(ROOT / "examples" / "cuda_training_sim.py"), "--steps", "3",
                    "--kernels-per-step", "10", "--step-sleep-ms", "1"]
        r = _cli("run", "--otlp-endpoint", f"http://127.0.0.1:{port}", "--", *workload)
    finally:
        server.stop(0)
    assert r.returncode == 0, r.stderr  # spans arrived: not "lost everything"
    line = next(x for x in r.stderr.splitlines() if x.startswith("otel-ebpf: exporter otlp -> "))
    assert f"sent {sum(got)} spans" in line and "; LOST " in line and "metric collection" in line, line
    assert "export_failed" in line, line
    assert r.stderr.count("(UNIMPLEMENTED)") == 1 and "opentelemetry.exporter" not in r.stderr
