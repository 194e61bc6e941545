"""otel_ebpf.host.gpus: CUDA_VISIBLE_DEVICES parsing, ordinal -> GPU UUID, and hw.id on CUDA/NCCL signals."""
from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.host.gpus import MISMATCH, UNRESOLVED, GpuInfo, GpuResolver, VisibleDevices, ordinal_uuids, \
    parse_visible_devices
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config as CudaConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.processors.nccl import Config as NcclConfig
from otel_ebpf.processors.nccl import NcclProcessor
from otel_ebpf.receivers.cuda.events import AllocCall, CallStats, FreeCall, MemcpyCall
from otel_ebpf.receivers.nccl.events import NcclCollective, NcclCommInfo, NcclCommInit
from otel_ebpf.core.telemetry import Telemetry

# NVML index order differs from PCI order on purpose: CUDA's PCI_BUS_ID order is by bus id.
A = GpuInfo("GPU-aaaaaaaa-0000-4000-8000-000000000000", 0, "00000000:3B:00.0", "NVIDIA H100 80GB HBM3")
B = GpuInfo("GPU-bbbbbbbb-0000-4000-8000-000000000001", 1, "00000000:18:00.0", "NVIDIA H100 80GB HBM3")
C = GpuInfo("GPU-abcdef00-0000-4000-8000-000000000002", 2, "00000000:86:00.0", "NVIDIA H100 80GB HBM3",
            migs=("MIG-11111111-2222-4333-8444-555555555555",))
TABLE = [A, B, C]  # PCI order: B (18), A (3B), C (86)
MIXED = [A, GpuInfo(B.uuid, 1, B.bus_id, "NVIDIA A100-SXM4-40GB"), C]


@pytest.mark.parametrize(("text", "entries", "invalid"), [
    ("0", ("0",), None),
    ("1,0", ("1", "0"), None),
    (" 2 , 03 ", ("2", "3"), None),
    ("GPU-aaaaaaaa-0000-4000-8000-000000000000", ("GPU-aaaaaaaa-0000-4000-8000-000000000000",), None),
    ("GPU-ab,1", ("GPU-ab", "1"), None),
    ("MIG-11111111-2222-4333-8444-555555555555", ("MIG-11111111-2222-4333-8444-555555555555",), None),
    ("MIG-GPU-aaaaaaaa-0000-4000-8000-000000000000/1/0", ("MIG-GPU-aaaaaaaa-0000-4000-8000-000000000000/1/0",),
     None),
    ("", (), None),
    ("   ", (), None),
    ("-1", (), "-1"),
    ("0,-1,1", ("0",), "-1"),
    ("0,,1", ("0",), ""),
    ("0,nvidia0", ("0",), "nvidia0"),
    ("GPU-", (), "GPU-"),
    ("1,1", ("1",), "1"),
    ("0, 00", ("0",), "00"),
])
def test_visible_devices_are_split_and_cut_at_the_first_invalid_entry(text: str, entries: tuple[str, ...],
                                                                     invalid: str | None) -> None:
    assert parse_visible_devices(text) == VisibleDevices(entries, invalid)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, [B.uuid, A.uuid, C.uuid]),  # no CUDA_VISIBLE_DEVICES: every GPU, PCI bus order
    ({"CUDA_VISIBLE_DEVICES": "2,0"}, [C.uuid, B.uuid]),  # integers are positions in that order
    ({"CUDA_VISIBLE_DEVICES": A.uuid}, [A.uuid]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa"}, [B.uuid, A.uuid]),  # unique prefixes, order kept
    ({"CUDA_VISIBLE_DEVICES": "GPU-a,1"}, []),  # ambiguous prefix (aaaa.. and abcd..) ends the list
    ({"CUDA_VISIBLE_DEVICES": "1,7,0"}, [A.uuid]),  # out of range ends it
    ({"CUDA_VISIBLE_DEVICES": "0,GPU-bbbbbbbb"}, [B.uuid]),  # the same GPU twice ends it
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "-1,0"}, []),
    ({"CUDA_VISIBLE_DEVICES": C.migs[0]}, [C.migs[0]]),
    ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-aaaaaaaa-0000-4000-8000-000000000000/1/0"}, []),  # legacy form: unknown
])
def test_ordinals_follow_cuda_visible_devices_over_pci_order(env: dict[str, str], expected: list[str]) -> None:
    assert ordinal_uuids(TABLE, env) == (expected, "")


def test_fastest_first_over_mixed_models_leaves_integer_ordinals_unknown_but_uuids_resolve() -> None:
    assert ordinal_uuids(MIXED, {}) == (None, "fastest_first")
    assert ordinal_uuids(MIXED, {"CUDA_VISIBLE_DEVICES": "0"}) == (None, "fastest_first")
    assert ordinal_uuids(MIXED, {"CUDA_VISIBLE_DEVICES": f"{C.uuid},{A.uuid}"}) == ([C.uuid, A.uuid], "")
    assert ordinal_uuids(MIXED, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}) == ([B.uuid], "")


@pytest.mark.parametrize(("nvidia", "cuda", "expected"), [
    (f"{C.uuid},{A.uuid}", None, ([A.uuid, C.uuid], "")),  # mounted GPUs, enumerated in PCI order
    ("2,0", "1", ([C.uuid], "")),  # NVML indices; CUDA's 1 is the second mounted GPU
    ("all", "0", ([B.uuid], "")),
    ("none", None, ([], "")),
    ("void", None, ([], "")),
    ("/var/run/nvidia-container-devices", None, (None, "nvidia_visible_devices")),
    ("GPU-ffff", None, (None, "nvidia_visible_devices")),
    (C.migs[0], "0", ([C.migs[0]], "")),  # a MIG slice (nvidia.com/mig-*): CUDA's only device
    (f"{C.migs[0]},{B.uuid}", None, ([B.uuid, C.migs[0]], "")),
    ("MIG-99999999-2222-4333-8444-555555555555", None, (None, "nvidia_visible_devices")),  # not on this node
])
def test_nvidia_visible_devices_narrows_the_gpus_of_a_container(nvidia: str, cuda: str | None,
                                                                expected: tuple[list[str] | None, str]) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": nvidia, **({"CUDA_VISIBLE_DEVICES": cuda} if cuda is not None else {})}
    assert ordinal_uuids(TABLE, env, in_container=True) == expected
    if cuda is None:  # on the host the container runtime's variable means nothing
        assert ordinal_uuids(TABLE, env, in_container=False) == ([B.uuid, A.uuid, C.uuid], "")


class FakeNvml:
    """A GPU table and process list standing in for NVML (GpuSource)."""

    def __init__(self, gpus: list[GpuInfo], why: str = "") -> None:
        self.table, self.why = gpus, why
        self.procs: dict[int, frozenset[str]] = {}
        self.opens = self.process_calls = self.closes = 0

    def open(self) -> str:
        self.opens += 1
        return self.why

    def gpus(self) -> list[GpuInfo]:
        return list(self.table)

    def processes(self) -> dict[int, frozenset[str]]:
        self.process_calls += 1
        return dict(self.procs)

    def close(self) -> None:
        self.closes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def resolver(envs: Mapping[int, dict[str, str] | None], nvml: FakeNvml | None = None, **kw: object) -> GpuResolver:
    def env_of(pid: int) -> tuple[Mapping[str, str], bool] | None:
        env = envs.get(pid)
        return None if env is None else (env, False)

    return GpuResolver(nvml or FakeNvml(TABLE), env_of, Telemetry(), **kw)  # type: ignore[arg-type]


def test_resolver_maps_each_ordinal_and_an_unknown_device_only_when_unambiguous() -> None:
    r = resolver({1: {"CUDA_VISIBLE_DEVICES": "2,1"}, 2: {"CUDA_VISIBLE_DEVICES": B.uuid}, 3: {}})
    assert (r.hw_id(1, 0), r.hw_id(1, 1), r.hw_id(1, 2)) == (C.uuid, A.uuid, None)
    assert r.hw_id(1, -1) is None  # two GPUs visible, no cudaSetDevice seen: could be either
    assert r.hw_id(2, -1) == B.uuid  # one GPU visible: it is that one
    assert r.hw_id(3, 1) == A.uuid
    assert r._telemetry.get(UNRESOLVED, reason="ordinal_not_visible") == 1
    assert r._telemetry.get(UNRESOLVED, reason="unknown_device") == 1


def test_nvml_process_list_fills_a_missing_environment_and_overrides_a_wrong_one() -> None:
    nvml = FakeNvml(TABLE)
    nvml.procs = {7: frozenset({C.uuid}), 8: frozenset({A.uuid}), 9: frozenset({A.uuid, C.uuid})}
    r = resolver({7: None, 8: {"CUDA_VISIBLE_DEVICES": "0"}, 9: None}, nvml)
    assert r.hw_id(7, 0) == C.uuid and r.hw_id(7, -1) == C.uuid  # environ gone: on one GPU only
    assert r.hw_id(8, 0) == A.uuid  # env says B (PCI first); it set CUDA_VISIBLE_DEVICES at run time
    assert r._telemetry.get(MISMATCH) == 1
    assert r.hw_id(9, 0) is None  # on two GPUs, no environment: unknown
    assert r._telemetry.get(UNRESOLVED, reason="environ_unreadable") == 1


def test_answers_are_cached_with_ttls_bounded_and_forgotten_at_exit() -> None:
    clock = Clock()
    nvml = FakeNvml(TABLE)
    envs: dict[int, dict[str, str] | None] = {pid: {"CUDA_VISIBLE_DEVICES": "0"} for pid in range(10)}
    envs[50] = None
    r = resolver(envs, nvml, clock=clock, max_entries=4, ttl_s=30, negative_ttl_s=5, process_refresh_s=1)
    assert r.hw_id(0, 0) == B.uuid
    envs[0] = {"CUDA_VISIBLE_DEVICES": "1"}
    assert r.hw_id(0, 0) == B.uuid  # cached
    clock.now += 31
    assert r.hw_id(0, 0) == A.uuid  # expired: resolved again
    assert r.hw_id(50, 0) is None
    nvml.procs = {50: frozenset({C.uuid})}
    clock.now += 2
    assert r.hw_id(50, 0) is None  # the negative answer holds for 5 s
    clock.now += 4
    assert r.hw_id(50, 0) == C.uuid
    for pid in range(1, 10):
        r.hw_id(pid, 0)
    assert len(r._cache) == 4
    assert r._ordinals == {6: {0}, 7: {0}, 8: {0}, 9: {0}}  # the per-pid index follows the evictions
    r.forget(9)
    assert (9, 0) not in r._cache and len(r._cache) == 3 and 9 not in r._ordinals
    r.hw_id(8, 1)
    r.forget(8)
    assert not any(k[0] == 8 for k in r._cache) and 8 not in r._ordinals
    assert nvml.opens == 1


def test_without_nvml_one_warning_and_no_hw_id(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(TABLE, why="libnvidia-ml.so.1 was not found (no NVIDIA driver on this host)")
    r = resolver({1: {}}, nvml)
    with caplog.at_level(logging.INFO, logger="otel_ebpf.host.gpus"):
        assert [r.hw_id(1, d) for d in (0, 1, 0, -1)] == [None] * 4
    assert [rec.getMessage() for rec in caplog.records] == [
        "GPU identity: no hw.id on CUDA/NCCL signals (cuda.device.index is kept): libnvidia-ml.so.1 was not found "
        "(no NVIDIA driver on this host)"]
    assert nvml.opens == 1 and r.gpus == []
    r.close()
    r.close()
    assert nvml.closes == 0  # never opened successfully: nothing to release


def test_a_failing_environment_lookup_is_not_an_error_for_the_caller() -> None:
    def broken(pid: int) -> None:
        raise OSError("boom")

    r = GpuResolver(FakeNvml(TABLE), broken)  # type: ignore[arg-type]
    assert r.hw_id(1, 0) is None
    r.close()
    assert r.hw_id(2, 0) is None


# ---- the processors put hw.id next to the device index ---------------------------------------

T0 = 1_700_000_000_000_000_000


def _ctx(envs: Mapping[int, dict[str, str] | None], nvml: FakeNvml | None = None) -> Context:
    ctx = Context()
    ctx.gpus = resolver(envs, nvml)
    return ctx


def test_cuda_spans_and_metrics_carry_hw_id_and_allocations_keep_theirs_until_freed() -> None:
    ctx = _ctx({5: {"CUDA_VISIBLE_DEVICES": f"{A.uuid},{C.uuid}"}})
    out = ListConsumer()
    proc = CudaProcessor(CudaConfig(), ctx, out)
    proc.consume([MemcpyCall(5, 6, "cudaMemcpy", 1, T0, T0 + 10, 0, 1, 2, 4096, 0, 1),
                  CallStats(5, "cudaMemcpy", 1, 0, 1, 1, 0, 10, 4096, (0,) * 24, (0,) * 7 + (1,) + (0,) * 10, T0),
                  AllocCall(5, 6, "cudaMalloc", 0, T0, T0 + 10, 0, 0x7000, 1 << 20, 0, 0)])
    ctx.gpus._cache.clear()  # a changed answer must not split the outstanding-memory series
    ctx.gpus._env_of = lambda pid: ({"CUDA_VISIBLE_DEVICES": B.uuid}, False)
    proc.consume([FreeCall(5, 6, "cudaFree", 0, T0 + 20, T0 + 30, 0, 0x7000, 0),
                  ProcessExit(5, T0 + 40, "train", 0, "cuda")])
    records = out.take()
    [copy] = [r for r in records if isinstance(r, SpanRecord) and r.name == "cudaMemcpy"]
    assert copy.attributes["hw.id"] == C.uuid and copy.attributes["cuda.device.index"] == 1
    metrics = {(m.name, m.value): dict(m.attributes) for m in records if isinstance(m, MetricRecord)}
    assert metrics[("gpu.cuda.memory.copies", 4096)]["hw.id"] == C.uuid
    assert metrics[("gpu.cuda.memory.outstanding", 1 << 20)] == {"cuda.device.index": 0, "hw.id": A.uuid}
    assert metrics[("gpu.cuda.memory.outstanding", -(1 << 20))] == {"cuda.device.index": 0, "hw.id": A.uuid}
    assert (5, 0) not in ctx.gpus._cache  # forgotten at the CUDA receiver's exit record


def test_cuda_signals_without_a_resolver_are_unchanged() -> None:
    out = ListConsumer()
    copy = MemcpyCall(5, 6, "cudaMemcpy", 1, T0, T0 + 1, 0, 1, 2, 8, 0, 1)
    CudaProcessor(CudaConfig(), Context(), out).consume([copy])
    assert all("hw.id" not in r.attributes for r in out.take() if isinstance(r, SpanRecord | MetricRecord))


def test_nccl_collectives_carry_the_hw_id_of_the_communicator_device() -> None:
    ctx = _ctx({10: {"CUDA_VISIBLE_DEVICES": "2,0"}, 11: {"CUDA_VISIBLE_DEVICES": "1"}})
    out = ListConsumer()
    proc = NcclProcessor(NcclConfig(host="node-a"), ctx, out)
    uid = bytes(range(128))
    proc.consume([NcclCommInit(10, 10, 1, 2, "ncclCommInitRank", 0x50, 2, 0, uid, 0),
                  NcclCommInit(11, 11, 1, 2, "ncclCommInitRank", 0x50, 2, 1, uid, 0),
                  NcclCommInfo(10, 10, 3, 0x50, "device", 1, 0),
                  NcclCollective(10, 10, 100, 200, "AllReduce", 0x50, 1024, 7, 0, None, 0xabc, 0, 0, 0),
                  NcclCollective(11, 11, 100, 200, "AllReduce", 0x50, 1024, 7, 0, None, 0xabc, 0, 0, 0)])
    records = out.take()
    spans = {(s.pid, s.name): s.attributes for s in records if isinstance(s, SpanRecord)}
    assert spans[(10, "ncclAllReduce")]["hw.id"] == B.uuid  # ncclCommCuDevice said 1: second of "2,0"
    assert spans[(11, "ncclAllReduce")]["hw.id"] == A.uuid  # device unknown, one GPU visible
    assert spans[(11, "ncclCommInitRank")]["hw.id"] == A.uuid
    assert "hw.id" not in spans[(10, "ncclCommInitRank")]  # two GPUs visible, device not yet known
    calls = {m.pid: m.attributes for m in records if isinstance(m, MetricRecord) and m.name == "nccl.calls"}
    assert calls[10]["hw.id"] == B.uuid and calls[11]["hw.id"] == A.uuid


def test_attach_shares_one_resolver_per_context_reading_the_resource_cache(tmp_path) -> None:
    from otel_ebpf.host.gpus import NvmlSource, attach
    from otel_ebpf.host.processes import ResourceCache, process_environment
    from tests.unit.host.test_resources import _env, make_proc

    cgroup = "0::/system.slice/docker-" + "ab" * 32 + ".scope\n"
    make_proc(tmp_path, 31, environ=_env(CUDA_VISIBLE_DEVICES="GPU-bbbb", HOME="/root"), cgroup=cgroup)
    ctx = Context()
    ctx.resources = ResourceCache(proc_root=str(tmp_path))
    resolver = attach(ctx)
    assert attach(ctx) is resolver and ctx.gpus is resolver
    assert resolver._env_of(31) == ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, True)  # HOME is never read
    assert resolver._env_of(32) is None
    assert isinstance(resolver.source, NvmlSource) and resolver.source.library == ""
    attach(ctx, "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1")  # receivers.nvml.library, before NVML loads
    assert resolver.source.library == "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1"
    assert process_environment(31, proc_root=str(tmp_path)) == ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, True)
    assert process_environment(32, proc_root=str(tmp_path)) is None
