"""Stream capture on real uprobes: work recorded into a CUDA graph is marked captured, not counted as run.

tests/bpf/cuda_capture.c makes torch.cuda.graph's calls (capture begin on a pool stream, kernels from the capturing
thread and from a second thread on the capture stream, end, replays) against tests/bpf/stand_in_cudart.c, whose
capture calls succeed, and against NVIDIA's libcudart.so.12, whose capture calls fail (35 without a driver): a
failed begin opens nothing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.receivers.cuda import Config
from otel_ebpf.receivers.cuda.events import CallStats, GraphLaunchCall, KernelLaunchStats, MemcpyCall

from .test_cuda_receiver import build_c, stand_in_cudart, traced  # noqa: F401 (a fixture)

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def cuda_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "cuda_capture.c", "cuda_capture", "-pthread")


def _launches(stats: list[KernelLaunchStats]) -> dict[bool, int]:
    out = {False: 0, True: 0}
    for s in stats:
        out[s.captured] += s.count
    return out


def test_work_of_a_capture_is_marked_captured_from_either_thread(
        bpf_ready: None, cuda_capture: Path, stand_in_cudart: Path) -> None:  # noqa: F811 (the imported fixture)
    with traced([str(cuda_capture), str(stand_in_cudart)], Config(stats_interval=0.05, span_rate_limit=0)) as t:
        t.release()
        # the capture closed: nothing is left open in the kernel
        assert t.receiver.bpf["capture_open"][0].value == 0
        assert len(list(t.receiver.bpf["capture_streams"].keys())) == 0
        t.receiver.shutdown()
        assert {rc for _, rc in t.results()} == {0}, t.stdout
        # 3 from the capturing thread, 2 from the other thread on the capture stream; run: 1 before, 1 after,
        # 1 from the other thread on a stream that is not capturing
        assert _launches(t.events(KernelLaunchStats)) == {True: 5, False: 3}
        copies = sorted(t.events(MemcpyCall), key=lambda c: c.bytes)
        assert [(c.bytes, c.captured) for c in copies] == [(4096, True), (8192, False)]
        replays = t.events(GraphLaunchCall)
        assert len(replays) == 2 and not any(r.captured for r in replays)
        stats = {(s.api, s.captured): s.calls for s in t.events(CallStats)}
        assert stats[("cudaStreamBeginCapture", False)] == 1 and stats[("cudaStreamEndCapture", False)] == 1
        assert stats[("cudaMemcpyAsync", True)] == 1 and stats[("cudaMemcpyAsync", False)] == 1
        assert stats[("cudaGraphLaunch", False)] == 2 and ("cudaGraphLaunch", True) not in stats


def test_a_failed_capture_begin_opens_nothing(bpf_ready: None, cuda_capture: Path, cudart: Path) -> None:
    with traced([str(cuda_capture), str(cudart)], Config(stats_interval=0.05)) as t:
        t.release()
        assert t.receiver.bpf["capture_open"][0].value == 0
        t.receiver.shutdown()
        assert {rc for _, rc in t.results()} == {35}
        assert _launches(t.events(KernelLaunchStats)) == {True: 0, False: 8}
        stats = {(s.api, s.captured, s.rc): s.calls for s in t.events(CallStats)}
        assert stats[("cudaStreamBeginCapture", False, 35)] == 1
        assert not any(captured for _, captured, _ in stats)
