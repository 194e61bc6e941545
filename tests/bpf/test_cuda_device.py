"""The device of threads that chose theirs before the agent attached (run --pid, an agent restart): learned from
cudaGetDevice for ``learn_device_for`` seconds after the attach, then the probe goes. Drives tests/bpf/cuda_device.c
(threads that set their device, then ask for it and launch, as PyTorch does) against the stand-in runtime
(tests/bpf/stand_in_cudart.c: a per-thread current device, as CUDA's). Needs root and BCC."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from otel_ebpf.receivers.cuda import Config
from otel_ebpf.receivers.cuda.events import KernelLaunchStats
from tests.bpf.test_cuda_receiver import build_c, stand_in_cudart, traced  # noqa: F401  (a fixture)

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def cuda_device(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "cuda_device.c", "cuda_device", "-pthread")


def _devices(t: object) -> dict[int, set[int]]:
    """grid size -> the devices its launches were counted on."""
    out: dict[int, set[int]] = {}
    for s in t.events(KernelLaunchStats):  # type: ignore[attr-defined]
        out.setdefault(s.grid_size, set()).add(s.device)
    return out


def test_devices_set_before_the_attach_are_learned_within_the_window(
        bpf_ready: None, cuda_device: Path, stand_in_cudart: Path) -> None:  # noqa: F811
    with traced([str(cuda_device), str(stand_in_cudart)], Config(learn_device_for=1.5)) as t:
        learning = t.receiver._learning
        assert learning.paths == [str(stand_in_cudart.resolve())]
        assert t.proc.stdin is not None and t.proc.stdout is not None
        t.proc.stdin.write("go\n")
        t.proc.stdin.flush()
        first = [t.proc.stdout.readline() for _ in range(4)]
        assert first[-1].strip() == "phase1 done", first
        assert first[0].strip() == "cudaGetDevice rc=0 device=1", first
        deadline = time.monotonic() + 20
        while learning.paths and time.monotonic() < deadline:  # the poll loop ends the window
            time.sleep(0.05)
        assert not learning.paths, "the learning window did not end"
        t.release()
        t.receiver.shutdown()
        assert [rc for _, rc in t.results()] == [0, 0, 0], t.stdout
        # main (device 1) asked cudaGetDevice in the window: learned, and it stays learned; B (device 2) did not ask
        # in the window and asked only after it (the probe was gone): CUDA's default, 0
        assert _devices(t) == {1: {1}, 2: {0}, 4: {1}, 3: {0}}, _devices(t)


def test_no_learning_when_off(
        bpf_ready: None, cuda_device: Path, stand_in_cudart: Path) -> None:  # noqa: F811
    """learn_device_for: 0 attaches nothing; the program's threads stay on CUDA's default device."""
    with traced([str(cuda_device), str(stand_in_cudart)], Config(learn_device_for=0)) as t:
        assert t.receiver._learning.paths == []
        t.release(lines="go\nlater\n")
        t.receiver.shutdown()
        assert _devices(t) == {1: {0}, 2: {0}, 4: {0}, 3: {0}}, _devices(t)
