"""The agent attached to a real PyTorch process that set its GPU before the agent was there (``run --pid``):
its launches are counted on the device it chose, learned from torch's own cudaGetDevice calls within the
receiver's ``learn_device_for`` window (issue 15), not on CUDA's default device 0. torch 2.11 on the twin (two
stand-in GPUs). Needs root and BCC."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.launch import twin_environment
from tests.faults.agentproc import counter_total
from tests.support.otlp_sink import metrics_from_jsonl
from tests.twin.conftest import PROGRAMS

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(300)]


def _wait(what: str, done: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)


def test_a_device_chosen_before_the_attach_is_learned(bpf_ready: None, twin: TwinEnv, libdir: Path,
                                                      tmp_path: Path) -> None:
    agent_out, config = tmp_path / "agent", tmp_path / "config.yaml"
    config.write_text("receivers:\n  cuda: {}\nservice:\n  health_endpoint: ''\n")
    rendezvous = Path(tempfile.mkdtemp(prefix="otel-ebpf-twin-"))
    env = twin_environment(libdir, 2, rendezvous)
    job = subprocess.Popen([str(twin.python), str(PROGRAMS / "device_attach.py"), str(tmp_path)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    agent = None
    try:
        _wait("ready", lambda: (tmp_path / "ready").exists() or job.poll() is not None, 120)
        assert job.poll() is None, job.communicate()[0][-3000:]
        agent = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--log-level", "info", "--quiet",
                                  "--config", str(config), "--output", str(agent_out), "--pid", str(job.pid)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err: list[str] = []
        assert agent.stderr is not None
        reader = threading.Thread(target=lambda: err.extend(agent.stderr), daemon=True)  # type: ignore[union-attr]
        reader.start()
        _wait("'tracing started'", lambda: any("tracing started" in line for line in err) or agent.poll() is not None,
              120)
        assert agent.poll() is None, "".join(err)[-3000:]
        (tmp_path / "go").write_text("")
        assert job.wait(timeout=60) == 0, job.communicate()[0][-3000:]
        assert agent.wait(timeout=60) == 0, "".join(err)[-3000:]
        reader.join(timeout=10)
    finally:
        for p in (job, agent):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    metrics = metrics_from_jsonl(agent_out / "metrics.jsonl")
    total = counter_total(metrics, "gpu.cuda.kernel.launch.calls")
    on_1 = counter_total(metrics, "gpu.cuda.kernel.launch.calls", **{"cuda.device.index": 1})
    assert total >= 20 and on_1 == total, (on_1, total)  # 10 x (mul, add), every one on device 1
    text = "".join(err)
    assert "learning their threads' devices from cudaGetDevice" in text, text[-3000:]
    print(f"after attaching to a running torch process on device 1: {on_1:.0f} of {total:.0f} launches on device 1")
