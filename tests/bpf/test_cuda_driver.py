"""The cuda receiver on the driver API (libcuda.so.1): launches and graph replays made straight on the driver
(Triton, cuBLAS's static runtime, NCCL) are counted, and a runtime launch, which reaches the driver too, is
counted once. Drives tests/bpf/cuda_mixed.c against the stand-in runtime (tests/bpf/stand_in_cudart.c), which
calls the stand-in driver (tests/bpf/stand_in_cuda.c, NOT NVIDIA's) as libcudart 12 does. Needs root and BCC."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config as ProcessorConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.receivers.cuda import Config
from otel_ebpf.receivers.cuda.events import CallStats, GraphLaunchCall, KernelLaunch, KernelLaunchStats
from otel_ebpf.receivers.cuda.receiver import DRIVER_PROBES
from tests.bpf.test_cuda_receiver import build_c, stand_in_cudart, traced  # noqa: F401  (a fixture)

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def stand_in_cuda(tmp_path_factory: pytest.TempPathFactory, cudart: Path) -> Path:
    """libcuda.so.1 built against the cuda.h of the nvidia-cuda-runtime wheel the tests install."""
    include = cudart.parent.parent / "include"
    assert (include / "cuda.h").is_file(), include
    return build_c(tmp_path_factory, "stand_in_cuda.c", "libcuda.so.1", "-fno-omit-frame-pointer", f"-I{include}",
                   soname="libcuda.so.1")


@pytest.fixture(scope="module")
def cuda_mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "cuda_mixed.c", "cuda_mixed")


def test_driver_launches_are_counted_and_runtime_launches_once(bpf_ready: None, cuda_mixed: Path,
                                                               stand_in_cudart: Path, stand_in_cuda: Path) -> None:  # noqa: F811
    env = {"LD_LIBRARY_PATH": str(stand_in_cuda.parent)}
    with traced([str(cuda_mixed), str(stand_in_cudart)], Config(launch_sample_every=1), env=env) as t:
        attached = t.receiver.ctx.telemetry.get("otel_ebpf.probes.attached", library=stand_in_cuda.name)
        assert attached == sum((p.entry is not None) + (p.ret is not None) for p in DRIVER_PROBES)
        t.release()
        t.receiver.shutdown()
        assert {rc for _, rc in t.results()} == {0} and len(t.results()) == 10, t.stdout
        stats = {(s.api, s.grid_size, s.block_size): s.count for s in t.events(KernelLaunchStats)}
        # 8 launches reached the driver; the 3 made through the runtime are counted there, once
        assert stats == {("cudaLaunchKernel", 2, 32): 2, ("cuLaunchKernel", 4, 64): 3,
                         ("cudaLaunchKernelExC", 5, 128): 1, ("cuLaunchKernelEx", 6, 64): 1,
                         ("cuLaunchKernel_ptsz", 7, 16): 1}, stats
        func = t.printed("func")
        sampled = [(k.api, k.func, k.grid, k.block, k.shared_mem, k.stream) for k in t.events(KernelLaunch)
                   if k.api.startswith("cuLaunch")]
        assert sampled == [("cuLaunchKernel", func, (4, 1, 1), (64, 1, 1), 256, 0x61)] * 3 + [
            ("cuLaunchKernelEx", func, (6, 1, 1), (32, 2, 1), 512, 0x62),
            ("cuLaunchKernel_ptsz", func, (7, 1, 1), (16, 1, 1), 0, 0x64)]
        graphs = [(g.api, g.exec, g.stream) for g in t.events(GraphLaunchCall)]
        assert graphs == [("cudaGraphLaunch", 0x7000, 0x63), ("cuGraphLaunch", 0x7001, 0x63)]
        replays = {c.api: c.calls for c in t.events(CallStats) if "GraphLaunch" in c.api}
        assert replays == {"cudaGraphLaunch": 1, "cuGraphLaunch": 1}
        out = ListConsumer()
        CudaProcessor(ProcessorConfig(), Context(), out).consume(t.sink.take())
        by_api: dict[str, int] = {}
        for m in out.events:
            if isinstance(m, MetricRecord) and m.name == "gpu.cuda.kernel.launch.calls":
                api = dict(m.attributes)["cuda.api"]
                by_api[api] = by_api.get(api, 0) + int(m.value)
        assert by_api == {"cudaLaunchKernel": 2, "cuLaunchKernel": 4, "cudaLaunchKernelExC": 1, "cuLaunchKernelEx": 1}


def test_a_libcuda_that_is_not_the_driver_gets_no_probe(
        bpf_ready: None, cuda_mixed: Path, stand_in_cudart: Path, stand_in_cuda: Path, tmp_path: Path) -> None:  # noqa: F811
    """A libcuda* that is not the driver (libcudadebugger.so.1) is matched by the kernel's openat pattern
    ("libcuda") but gets no probe and no attach line."""
    other = tmp_path / "libcudadebugger.so.1"
    other.write_bytes(stand_in_cuda.read_bytes())
    receiver_cfg = Config(libraries=[str(other)])
    env = {"LD_LIBRARY_PATH": str(stand_in_cuda.parent)}
    with traced([str(cuda_mixed), str(stand_in_cudart)], receiver_cfg, env=env) as t:
        t.release()
        t.receiver.shutdown()
        assert t.receiver.ctx.telemetry.get("otel_ebpf.probes.attached", library=other.name) == 0
        assert str(other) not in t.receiver._attached
