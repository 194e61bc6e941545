"""The CLI as a user runs it: real probes, real exporters, OTLP over real sockets."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from otel_ebpf import nccl_profiler

from tests.support.otlp_sink import OtlpSink, metrics_from_jsonl, spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = [sys.executable, str(ROOT / "examples" / "cuda_training_sim.py"), "--steps", "3",
            "--kernels-per-step", "10", "--step-sleep-ms", "1"]
pytestmark = pytest.mark.bpf


def cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "otel_ebpf", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", ROOT), env=env, **kw)


def span_names(rows) -> set[str]:
    return {span.name for _, _, span in rows}


def test_check_reports_a_working_host(bpf_ready):
    r = cli("check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eBPF tracing can run on this host" in r.stdout
    assert "kernel headers" in r.stdout and "fix:" not in r.stdout.split("BPF load")[1].split("\n")[0]


def test_config_defaults_is_valid_documented_yaml(tmp_path):
    r = cli("config", "--defaults")
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert set(data) == {"receivers", "processors", "exporters", "service"}
    assert "# " in r.stdout and "cuda" in data["receivers"] and "nccl" in data["receivers"]
    f = tmp_path / "defaults.yaml"
    f.write_text(r.stdout)
    f.chmod(0o600)
    assert cli("config", "--validate", str(f)).returncode == 0


def test_config_error_names_the_key_path(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("receivers:\n  cuda:\n    launch_sample_every: 1\n    bogus_key: 3\n")
    f.chmod(0o600)
    r = cli("run", "--config", str(f), "--", "true")
    assert r.returncode == 2
    assert "receivers.cuda.bogus_key" in r.stderr


def test_world_writable_config_is_refused(tmp_path):
    f = tmp_path / "open.yaml"
    f.write_text("service:\n  strict: true\n")
    f.chmod(0o666)
    r = cli("run", "--config", str(f), "--", "true")
    assert r.returncode == 2 and "world-writable" in r.stderr and "chmod o-w" in r.stderr


def test_bad_pid_is_named(bpf_ready):
    r = cli("run", "--pid", "999999999")
    assert r.returncode == 1 and "999999999" in r.stderr


def test_exit_code_of_the_command_is_kept(bpf_ready, tmp_path):
    r = cli("run", "--output", str(tmp_path), "--", "sh", "-c", 'echo "plugin=$NCCL_PROFILER_PLUGIN"; exit 7')
    assert r.returncode == 7, r.stderr
    # the default pipeline's nccl receiver has the command load our NCCL profiler plugin, and says so first
    plugin = nccl_profiler.require_plugin()
    assert f"plugin={plugin}" in r.stdout
    assert r.stderr.startswith(f"otel-ebpf: NCCL GPU time: the command runs with NCCL_PROFILER_PLUGIN={plugin}")
    r = cli("run", "--output", str(tmp_path), "--", "/nonexistent/binary")
    assert r.returncode == 127 and "/nonexistent/binary" in r.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_run_exports_spans_and_metrics_over_otlp(bpf_ready, protocol):
    with OtlpSink() as sink:
        endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
        r = cli("run", "--otlp-endpoint", endpoint, "--otlp-protocol", protocol, "--", *WORKLOAD)
        assert r.returncode == 0, r.stderr
        spans = sink.spans()
        names = span_names(spans)
        assert {"cudaMemcpy", "cudaMemcpyAsync", "cudaMalloc", "cudaStreamSynchronize"} <= names, names
        res = next(attrs for attrs, _, s in spans if s.name == "cudaMemcpyAsync")
        assert res["process.executable.name"].startswith("python")
        assert "cuda_training_sim.py" in res["process.command_line"]
        assert res["host.name"] and res["process.pid"] > 0
        assert sink.wait_for(lambda: "gpu.cuda.kernel.launch.calls" in sink.metric_names(), 5)
        launches = [m for attrs, m in sink.metrics() if m.name == "gpu.cuda.kernel.launch.calls"]
        total = max(sum(dp.as_int for dp in m.sum.data_points) for m in launches)
        assert total == 3 * 10
        assert "otel_ebpf.events.received" in sink.metric_names()


def test_run_writes_otlp_json_lines_by_default(bpf_ready, tmp_path):
    r = cli("run", "--", *WORKLOAD, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "otel-ebpf-out"
    spans = spans_from_jsonl(out / "traces.jsonl")
    assert "cudaMemcpy" in span_names(spans)
    err = next(s for _, _, s in spans if s.name == "cudaMalloc")
    assert err.status.code == 2 and "cudaErrorInsufficientDriver" in err.status.message
    assert any(m.name == "gpu.cuda.kernel.launch.calls" for _, m in metrics_from_jsonl(out / "metrics.jsonl"))
    assert "spans" in r.stderr  # the closing summary


def test_attach_to_running_pid(bpf_ready, tmp_path):
    # steps keep coming for ~15 s, so the agent (started after the process, compiling every
    # default receiver's program: seconds on a busy 2-core machine) sees some of them
    argv = [*WORKLOAD[1:2], "--steps", "60", "--kernels-per-step", "2", "--step-sleep-ms", "250"]
    proc = subprocess.Popen([sys.executable, "-c", "import time,sys,runpy; time.sleep(2); "
                             f"sys.argv={argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"])
    try:
        r = cli("run", "--pid", str(proc.pid), "--output", str(tmp_path), timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        proc.kill()
        proc.wait()
    assert "cudaMemcpyAsync" in span_names(spans_from_jsonl(tmp_path / "traces.jsonl"))


def test_attach_to_a_launcher_traces_the_workers_it_started(bpf_ready, tmp_path):
    """run --pid of a launcher (a shell here, torchrun in life) traces the worker it had started before the
    attach: the kernel follows forks from the attach on only, so the agent walks the existing tree."""
    argv = [*WORKLOAD[1:2], "--steps", "60", "--kernels-per-step", "2", "--step-sleep-ms", "250"]
    worker = (f"{sys.executable} -c \"import time,sys,runpy; time.sleep(2); sys.argv={argv!r}; "
              "runpy.run_path(sys.argv[0], run_name='__main__')\"")
    launcher = subprocess.Popen(["sh", "-c", f"{worker}; echo worker done"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        kids: list[str] = []
        while not kids and time.monotonic() < deadline:  # the worker is forked
            time.sleep(0.05)
            kids = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
        assert kids, "the launcher started no worker"
        r = cli("run", "--pid", str(launcher.pid), "--output", str(tmp_path), timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        launcher.kill()
        launcher.wait()
    assert f"also tracing 1 process(es) that --pid {launcher.pid} started before the attach: {kids[0]}" in r.stderr
    pids = {res.get("process.pid") for res, _, s in spans_from_jsonl(tmp_path / "traces.jsonl")
            if s.name == "cudaMemcpyAsync"}
    assert pids == {int(kids[0])}, pids


def test_not_root_gets_a_clear_message(bpf_ready, tmp_path):
    if not Path("/usr/bin/setpriv").exists():
        pytest.fail("setpriv (util-linux) is needed to drop privileges in this test")
    r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "otel_ebpf", "run", "--output", str(tmp_path), "--", "true"],
                       capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ,
                                                                                 "PYTHONPATH": str(ROOT)})
    assert r.returncode == 3, r.stderr
    assert "root" in r.stderr and "otel-ebpf check" in r.stderr


def test_sigterm_flushes_and_forwards(bpf_ready, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--output", str(tmp_path), "--",
                          *WORKLOAD[:2], "--steps", "100000", "--step-sleep-ms", "5"],
                         cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        traces = tmp_path / "traces.jsonl"  # made empty at start: wait for the first spans in it
        while time.time() < deadline and not (traces.exists() and traces.stat().st_size > 0):
            time.sleep(0.2)
        p.terminate()
        _, err = p.communicate(timeout=60)
    finally:  # a run that did not end leaves neither it nor its command running into the next tests
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 128 + 15, err
    assert "cudaMemcpyAsync" in span_names(spans_from_jsonl(tmp_path / "traces.jsonl"))


@pytest.mark.parametrize("command, code, named", [(["no-such-command-oe"], 127, "no-such-command-oe"),
                                                   (["/nonexistent/tool"], 127, "/nonexistent/tool"),
                                                   (["{tmp}/data.txt"], 126, "data.txt")])
def test_a_command_that_cannot_run_is_said_at_once(tmp_path, command, code, named):
    # before the config is loaded or a probe compiled (it took 8 s): as a shell, 127 not found, 126 not executable
    (tmp_path / "data.txt").write_text("not a program\n")
    (tmp_path / "data.txt").chmod(0o644)
    command = [c.format(tmp=tmp_path) for c in command]
    t0 = time.monotonic()
    r = cli("run", "--output", str(tmp_path / "out"), "--", *command)
    took = time.monotonic() - t0
    assert r.returncode == code, r.stderr
    assert named in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists()  # nothing was set up
    assert took < 5, f"{took:.1f} s"  # the interpreter and the CLI's imports only (~0.5 s idle)
