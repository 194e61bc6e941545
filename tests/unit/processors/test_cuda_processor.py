"""otel_ebpf/processors/cuda: typed CUDA events -> SpanRecord/MetricRecord, then through the real Emitter."""
from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_ebpf.core.config import build
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import LibraryLoaded, MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config, CudaProcessor, error_name, factory
from otel_ebpf.processors.cuda.errors import CUDA_ERRORS
from otel_ebpf.receivers.cuda.events import (
    AllocCall,
    CallStats,
    EnclosingCall,
    FreeCall,
    GraphLaunchCall,
    KernelLaunch,
    KernelLaunchStats,
    MemcpyCall,
    SetDeviceCall,
    SyncCall,
)
from otel_ebpf.core.telemetry import DROPPED, Telemetry

T0 = 1_700_000_000_000_000_000
PID, TID = 4242, 4243
PTR = 0x7F5A00000000


def memcpy(rc: int = 0, api: str = "cudaMemcpyAsync", nbytes: int = 32768, kind: int = 2,
           device: int = 1) -> MemcpyCall:
    return MemcpyCall(PID, TID, api, device, T0, T0 + 5000, rc, 0x1000, 0x2000, nbytes, 0xABC, kind)


def malloc(ptr: int, size: int, device: int = 1, rc: int = 0, pid: int = PID,
           api: str = "cudaMalloc") -> AllocCall:
    return AllocCall(pid, TID, api, device, T0, T0 + 1000, rc, ptr if rc == 0 else 0, size, 0, 0)


def free(ptr: int, device: int = 1, rc: int = 0, pid: int = PID) -> FreeCall:
    return FreeCall(pid, TID, "cudaFree", device, T0 + 2000, T0 + 3000, rc, ptr, 0)


def call_stats(api: str = "cudaMemcpyAsync", *, calls: int = 1, durs_ns: tuple[int, ...] = (5000,),
               sizes: tuple[int, ...] = (32768,), rc: int = 0, kind: int = 2, device: int = 1,
               limited: int = 0) -> CallStats:
    """What the receiver reads from the kernel's call_stats: observations bucketed over the
    emitter's bounds (the durations/sizes given are spread over ``calls``, cycling)."""
    import bisect

    from otel_ebpf.core.buckets import bounds_for_unit

    dur_b, size_b = bounds_for_unit("s"), bounds_for_unit("By")
    dh, bh = [0] * (len(dur_b) + 1), [0] * (len(size_b) + 1)
    dsum = bsum = 0
    memcpy_api = "Memcpy" in api
    has_bytes = memcpy_api or "Memset" in api or api == "cudaHostRegister"
    for i in range(calls):
        d, b = durs_ns[i % len(durs_ns)], sizes[i % len(sizes)]
        dh[bisect.bisect_left(dur_b, d / 1e9)] += 1
        dsum += d
        if has_bytes:
            bh[bisect.bisect_left(size_b, b)] += 1
            bsum += b
    return CallStats(PID, api, device, rc, kind if memcpy_api else 0, calls, limited, dsum, bsum,
                     tuple(dh), tuple(bh), T0)


class Rig:
    def __init__(self, **config: Any) -> None:
        self.ctx = Context()
        self.out = ListConsumer()
        self.proc = CudaProcessor(Config(**config), self.ctx, self.out)

    def run(self, *events: object) -> list[object]:
        self.proc.consume(list(events))
        return self.out.take()


def spans(records: list[object]) -> list[SpanRecord]:
    return [r for r in records if isinstance(r, SpanRecord)]


def metrics(records: list[object], name: str) -> list[MetricRecord]:
    return [r for r in records if isinstance(r, MetricRecord) and r.name == name]


# ---- spans and metrics per kind -------------------------------------------------------------

def test_memcpy_is_a_span_with_cuda_attributes_and_no_metric_of_its_own() -> None:
    out = Rig().run(memcpy())
    (span,) = spans(out)
    assert (span.pid, span.name, span.scope, span.start_ns, span.end_ns, span.error) == (
        PID, "cudaMemcpyAsync", "otel_ebpf.cuda", T0, T0 + 5000, None)
    assert dict(span.attributes) == {
        "cuda.api": "cudaMemcpyAsync", "cuda.device.index": 1, "cuda.return_code": 0, "thread.id": TID,
        "cuda.bytes": 32768, "cuda.memcpy.kind": "DeviceToHost", "cuda.stream": "0xabc"}
    assert not [r for r in out if isinstance(r, MetricRecord)]  # the kernel's call_stats carry them


def test_memcpy_call_stats_become_bytes_and_duration_histograms_from_kernel_buckets() -> None:
    ev = call_stats(calls=3, durs_ns=(5000, 2_000_000, 5000), sizes=(100, 32768, 32768), limited=2)
    rig = Rig()
    out = rig.run(ev)
    (copies,) = metrics(out, "gpu.cuda.memory.copies")
    assert (copies.kind, copies.unit, copies.value, copies.count, dict(copies.attributes)) == (
        "histogram", "By", 100 + 2 * 32768, 3, {"cuda.memcpy.kind": "DeviceToHost", "cuda.device.index": 1})
    assert copies.buckets == ev.bytes_hist and sum(copies.buckets) == 3
    (dur,) = metrics(out, "gpu.cuda.memory.copy.duration")
    assert (dur.unit, dur.value, dur.count, dur.buckets) == ("s", 2_010_000 / 1e9, 3, ev.dur_hist)
    assert dict(dur.attributes) == {"cuda.api": "cudaMemcpyAsync", "cuda.memcpy.kind": "DeviceToHost",
                                    "cuda.device.index": 1}
    assert not metrics(out, "gpu.cuda.api.errors") and not spans(out)
    assert rig.ctx.telemetry.get("otel_ebpf.spans.rate_limited", receiver="cuda") == 2


def test_failed_memcpy_call_stats_count_errors_and_durations_but_no_copies() -> None:
    out = Rig().run(call_stats("cudaMemcpy", calls=7, rc=35, device=-1))
    (errors,) = metrics(out, "gpu.cuda.api.errors")
    assert (errors.value, dict(errors.attributes)) == (
        7, {"cuda.api": "cudaMemcpy", "error.type": "cudaErrorInsufficientDriver"})
    assert not metrics(out, "gpu.cuda.memory.copies")  # nothing was copied
    (dur,) = metrics(out, "gpu.cuda.memory.copy.duration")
    assert dur.count == 7 and dur.attributes["error.type"] == "cudaErrorInsufficientDriver"


def test_failed_call_is_an_error_span_named_by_the_cuda_error() -> None:
    out = Rig().run(memcpy(rc=35, api="cudaMemcpy", device=-1))
    (span,) = spans(out)
    assert span.error == "cudaErrorInsufficientDriver"
    assert span.attributes["error.type"] == "cudaErrorInsufficientDriver"
    assert span.attributes["cuda.return_code"] == 35
    assert "cuda.device.index" not in span.attributes and "cuda.stream" not in span.attributes
    assert not metrics(out, "gpu.cuda.api.errors")  # counted from the kernel's call_stats (above)
    (malloc_span,) = spans(Rig().run(malloc(0, 1 << 40, rc=2)))
    assert malloc_span.error == "cudaErrorMemoryAllocation"


def test_failed_allocation_counts_its_error_from_the_record() -> None:
    (errors,) = metrics(Rig().run(malloc(0, 1 << 40, rc=2)), "gpu.cuda.api.errors")
    assert (errors.value, errors.attributes["error.type"]) == (1, "cudaErrorMemoryAllocation")


@pytest.mark.parametrize(("rc", "name"), [
    (0, "cudaSuccess"), (1, "cudaErrorInvalidValue"), (2, "cudaErrorMemoryAllocation"),
    (35, "cudaErrorInsufficientDriver"), (46, "cudaErrorDevicesUnavailable"),
    (98, "cudaErrorInvalidDeviceFunction"), (100, "cudaErrorNoDevice"), (101, "cudaErrorInvalidDevice"),
    (200, "cudaErrorInvalidKernelImage"), (225, "cudaErrorUnsupportedDevSideSync"),
    (304, "cudaErrorOperatingSystem"), (400, "cudaErrorInvalidResourceHandle"),
    (500, "cudaErrorSymbolNotFound"), (600, "cudaErrorNotReady"), (700, "cudaErrorIllegalAddress"),
    (719, "cudaErrorLaunchFailure"), (720, "cudaErrorCooperativeLaunchTooLarge"),
    (810, "cudaErrorMpsClientTerminated"), (999, "cudaErrorUnknown"), (12345, "cudaError(12345)"),
])
def test_error_names(rc: int, name: str) -> None:
    assert error_name(rc) == name


def test_driver_calls_are_named_by_cuda_h_cu_result() -> None:
    # the two enums share numbers with different names (cuda.h CUresult vs driver_types.h cudaError)
    assert error_name(3, "cuMemCreate") == "CUDA_ERROR_NOT_INITIALIZED"
    assert error_name(3, "cudaMalloc") == "cudaErrorInitializationError"
    assert error_name(2, "cuMemAlloc_v2") == "CUDA_ERROR_OUT_OF_MEMORY"
    assert error_name(4242, "cuGraphLaunch") == "CUresult(4242)"
    assert error_name(35) == "cudaErrorInsufficientDriver"


def test_error_table_covers_the_documented_ranges() -> None:
    wanted = [*range(0, 10), *range(12, 14), *range(16, 29), 31, 32, *range(34, 38), *range(43, 47), 49,
              52, 53, *range(65, 70), 98, 100, 101, *range(200, 202), *range(205, 226), *range(300, 305),
              400, 500, 600, *range(700, 706), *range(708, 721), *range(800, 811), 999]
    assert [rc for rc in wanted if rc not in CUDA_ERRORS] == []


def test_alloc_and_free_track_outstanding_bytes() -> None:
    rig = Rig()
    out = rig.run(malloc(PTR, 1 << 20))
    (span,) = spans(out)
    assert span.attributes["cuda.ptr"] == hex(PTR) and span.attributes["cuda.bytes"] == 1 << 20
    assert [(m.value, dict(m.attributes)) for m in metrics(out, "gpu.cuda.memory.allocations")] == [
        (1 << 20, {"cuda.api": "cudaMalloc", "cuda.device.index": 1})]
    assert [m.value for m in metrics(out, "gpu.cuda.memory.outstanding")] == [1 << 20]
    assert rig.proc.tracked_allocations == 1
    out = rig.run(free(PTR, device=0))  # freed from a thread bound elsewhere: the alloc's device counts
    (span,) = spans(out)
    assert span.attributes["cuda.bytes"] == 1 << 20 and span.error is None
    assert [(m.kind, m.value, dict(m.attributes)) for m in metrics(out, "gpu.cuda.memory.outstanding")] == [
        ("updown", -(1 << 20), {"cuda.device.index": 1})]
    assert [m.value for m in metrics(out, "gpu.cuda.memory.free.bytes")] == [1 << 20]
    assert rig.proc.tracked_allocations == 0


def test_free_of_unknown_pointer_is_counted_not_an_error() -> None:
    rig = Rig()
    out = rig.run(free(0xDEAD000), free(0))  # never seen; cudaFree(NULL) is a no-op
    assert [s.error for s in spans(out)] == [None, None]
    assert "cuda.bytes" not in spans(out)[0].attributes
    assert not metrics(out, "gpu.cuda.memory.outstanding")
    assert rig.ctx.telemetry.get("otel_ebpf.cuda.unknown_frees") == 1


def test_failed_malloc_and_failed_free_change_nothing() -> None:
    rig = Rig()
    rig.run(malloc(PTR, 4096))
    out = rig.run(malloc(0, 1 << 40, rc=2), free(PTR, rc=1))
    assert [s.error for s in spans(out)] == ["cudaErrorMemoryAllocation", "cudaErrorInvalidValue"]
    assert not metrics(out, "gpu.cuda.memory.outstanding") and not metrics(out, "gpu.cuda.memory.allocations")
    assert rig.proc.tracked_allocations == 1


def test_process_exit_reports_leaks_per_device_then_passes_on() -> None:
    rig = Rig()
    rig.run(malloc(PTR, 4096, device=0), malloc(PTR + 0x1000, 8192, device=1),
            malloc(PTR + 0x3000, 100, device=1), free(PTR + 0x3000), malloc(0x9000, 1, pid=77))
    exit_ = ProcessExit(PID, T0 + 10**9, "train", 0)
    out = rig.run(exit_)
    assert out[-1] is exit_
    assert [(m.value, dict(m.attributes)) for m in metrics(out, "gpu.cuda.memory.leaked")] == [
        (4096, {"cuda.device.index": 0}), (8192, {"cuda.device.index": 1})]
    assert [(m.value, m.unit) for m in metrics(out, "gpu.cuda.memory.leaked.allocations")] == [
        (1, "{allocation}"), (1, "{allocation}")]
    assert rig.proc.tracked_allocations == 1  # pid 77's
    assert rig.run(ProcessExit(PID, T0, "train", 0))[0] == ProcessExit(PID, T0, "train", 0)  # nothing left


def test_allocation_table_is_bounded() -> None:
    rig = Rig(max_tracked_allocations=2)
    out = rig.run(*(malloc(PTR + i * 0x1000, 10) for i in range(3)))
    assert rig.proc.tracked_allocations == 2
    assert len(metrics(out, "gpu.cuda.memory.allocations")) == 3  # all allocations still counted
    assert [m.value for m in metrics(out, "gpu.cuda.memory.outstanding")] == [10, 10]
    assert rig.ctx.telemetry.get(DROPPED, receiver="cuda", reason="alloc_table_full") == 1
    rig.run(free(PTR))
    rig.run(malloc(PTR + 0x9000, 10))
    assert rig.proc.tracked_allocations == 2


def test_sync_is_a_span_and_its_call_stats_a_wait_histogram_in_seconds() -> None:
    ev = SyncCall(PID, TID, "cudaStreamSynchronize_ptsz", 0, T0, T0 + 2_500_000, 0, 0x77)
    (span,) = spans(Rig().run(ev))
    assert span.name == "cudaStreamSynchronize_ptsz" and span.attributes["cuda.stream"] == "0x77"
    out = Rig().run(call_stats("cudaStreamSynchronize_ptsz", calls=4, durs_ns=(2_500_000,), device=0))
    (wait,) = metrics(out, "gpu.cuda.synchronize.duration")
    assert (wait.kind, wait.unit, wait.value, wait.count) == ("histogram", "s", 0.01, 4)
    assert wait.attributes == {"cuda.api": "cudaStreamSynchronize_ptsz", "cuda.device.index": 0}
    (calls,) = metrics(out, "gpu.cuda.stream.synchronize.calls")
    assert calls.value == 4
    ev_sync = SyncCall(PID, TID, "cudaEventSynchronize", 0, T0, T0 + 1, 0, 0x88)
    assert spans(Rig().run(ev_sync))[0].attributes["cuda.event"] == "0x88"


def test_graph_launch_is_a_span_and_its_call_stats_a_replay_counter() -> None:
    ev = GraphLaunchCall(PID, TID, "cudaGraphLaunch", 1, T0, T0 + 7000, 0, 0x6000, 0x77)
    (span,) = spans(Rig().run(ev))
    assert span.name == "cudaGraphLaunch" and span.attributes["cuda.graph.exec"] == "0x6000"
    assert span.attributes["cuda.stream"] == "0x77" and span.attributes["cuda.device.index"] == 1
    out = Rig().run(call_stats("cudaGraphLaunch_ptsz", calls=5, durs_ns=(7000,), device=1),
                    call_stats("cudaGraphLaunch", calls=2, rc=35, device=1))
    replays = metrics(out, "gpu.cuda.graph.launch.calls")
    assert sorted((m.value, m.attributes["cuda.api"]) for m in replays) == [(2, "cudaGraphLaunch"),
                                                                           (5, "cudaGraphLaunch_ptsz")]
    (errors,) = metrics(out, "gpu.cuda.api.errors")
    assert errors.value == 2 and errors.attributes["error.type"] == "cudaErrorInsufficientDriver"
    assert not metrics(out, "gpu.cuda.synchronize.duration")  # a replay is no host wait


def test_counted_calls_become_call_counters_durations_and_bytes() -> None:
    """OBI's set (memset, event record, stream wait-event, create/destroy, host register): counts,
    host time and, for memset and host register, bytes; never a span, never a sync metric."""
    out = Rig().run(call_stats("cudaMemsetAsync_ptsz", calls=3, durs_ns=(4000,), sizes=(1024,), device=0),
                    call_stats("cudaEventRecord", calls=7, durs_ns=(2000,), device=0),
                    call_stats("cudaStreamWaitEvent", calls=2, rc=400, device=0),
                    call_stats("cudaHostRegister", calls=1, sizes=(1 << 20,), device=0))
    assert not spans(out)
    calls = {m.attributes["cuda.api"]: m.value for m in metrics(out, "gpu.cuda.api.calls")}
    assert calls == {"cudaMemsetAsync_ptsz": 3, "cudaEventRecord": 7, "cudaStreamWaitEvent": 2, "cudaHostRegister": 1}
    durations = {m.attributes["cuda.api"]: (m.kind, m.count, m.attributes.get("error.type"))
                 for m in metrics(out, "gpu.cuda.api.duration")}
    assert durations["cudaEventRecord"] == ("histogram", 7, None)
    assert durations["cudaStreamWaitEvent"] == ("histogram", 2, "cudaErrorInvalidResourceHandle")
    (sets,) = metrics(out, "gpu.cuda.memory.sets")
    assert (sets.kind, sets.unit, sets.value, sets.count) == ("histogram", "By", 3072, 3)
    (pinned,) = metrics(out, "gpu.cuda.memory.host.registered")
    assert (pinned.kind, pinned.value) == ("counter", 1 << 20)
    (errors,) = metrics(out, "gpu.cuda.api.errors")
    assert errors.value == 2 and errors.attributes["cuda.api"] == "cudaStreamWaitEvent"
    assert not metrics(out, "gpu.cuda.synchronize.duration")


def test_set_device_span() -> None:
    (span,) = spans(Rig().run(SetDeviceCall(PID, TID, "cudaSetDevice", 3, T0, T0 + 10, 0, 3)))
    assert span.attributes["cuda.device.index"] == 3 and span.attributes["cuda.device.requested"] == 3


def test_launch_stats_become_counter_and_weighted_histograms() -> None:
    out = Rig().run(KernelLaunchStats(PID, 1, 42, 256, 10000, T0))
    (calls,) = metrics(out, "gpu.cuda.kernel.launch.calls")
    assert (calls.kind, calls.value, calls.count, dict(calls.attributes)) == (
        "counter", 10000, 1, {"cuda.device.index": 1})
    (grid,) = metrics(out, "gpu.cuda.kernel.grid.size")
    (block,) = metrics(out, "gpu.cuda.kernel.block.size")
    assert (grid.kind, grid.value, grid.count) == ("histogram", 42, 10000)
    assert (block.kind, block.value, block.count) == ("histogram", 256, 10000)
    assert not spans(out)


def test_launch_counts_carry_at_most_the_limit_of_kernel_names_per_process_the_rest_other() -> None:
    rig = Rig(kernel_name_limit=2)
    out = rig.run(KernelLaunchStats(PID, 0, 4, 128, 50, T0, kernel="at::native::elementwise_kernel"),
                  KernelLaunchStats(PID, 0, 4, 128, 20, T0, kernel="at::native::reduce_kernel"),
                  KernelLaunchStats(PID, 0, 4, 128, 5, T0, kernel="triton_poi_fused_add_0"),
                  KernelLaunchStats(PID, 0, 4, 128, 3, T0),  # not named: no attribute
                  KernelLaunchStats(PID + 1, 0, 4, 128, 1, T0, kernel="triton_poi_fused_add_0"))
    by_name = {(m.pid, m.attributes.get("cuda.kernel.name")): int(m.value)
               for m in metrics(out, "gpu.cuda.kernel.launch.calls")}
    assert by_name == {(PID, "at::native::elementwise_kernel"): 50, (PID, "at::native::reduce_kernel"): 20,
                       (PID, "other"): 5, (PID, None): 3, (PID + 1, "triton_poi_fused_add_0"): 1}
    # an admitted name keeps its series; a later kernel stays in "other", even when busier
    out = rig.run(KernelLaunchStats(PID, 0, 4, 128, 900, T0, kernel="at::native::gemv"),
                  KernelLaunchStats(PID, 0, 4, 128, 1, T0, kernel="at::native::reduce_kernel"))
    assert [m.attributes["cuda.kernel.name"] for m in metrics(out, "gpu.cuda.kernel.launch.calls")] == [
        "other", "at::native::reduce_kernel"]
    # the process exits: its admitted names go with it
    rig.run(ProcessExit(PID, T0, "train", 0))
    out = rig.run(KernelLaunchStats(PID, 0, 4, 128, 1, T0, kernel="at::native::gemv"))
    assert metrics(out, "gpu.cuda.kernel.launch.calls")[0].attributes["cuda.kernel.name"] == "at::native::gemv"


def test_kernel_name_limit_zero_puts_no_name_on_metrics_but_on_sampled_spans() -> None:
    rig = Rig(kernel_name_limit=0)
    out = rig.run(KernelLaunchStats(PID, 0, 4, 128, 5, T0, kernel="at::native::reduce_kernel"),
                  KernelLaunch(PID, TID, "cudaLaunchKernel", 0, T0, 0x4010, (1, 1, 1), (32, 1, 1), 0, 0, 1,
                               kernel="at::native::reduce_kernel"))
    assert "cuda.kernel.name" not in metrics(out, "gpu.cuda.kernel.launch.calls")[0].attributes
    assert spans(out)[0].attributes["cuda.kernel.name"] == "at::native::reduce_kernel"


def test_sampled_launch_is_a_zero_length_span() -> None:
    ev = KernelLaunch(PID, TID, "cudaLaunchKernel", 0, T0, 0x4010, (7, 3, 2), (128, 2, 1), 256, 0, 5)
    (span,) = spans(Rig().run(ev))
    assert (span.name, span.start_ns, span.end_ns) == ("cudaLaunchKernel", T0, T0)
    assert {k: span.attributes[k] for k in ("cuda.kernel.func", "cuda.kernel.grid", "cuda.kernel.block",
                                            "cuda.kernel.shared_mem", "cuda.kernel.launch_seq")} == {
        "cuda.kernel.func": "0x4010", "cuda.kernel.grid": (7, 3, 2), "cuda.kernel.block": (128, 2, 1),
        "cuda.kernel.shared_mem": 256, "cuda.kernel.launch_seq": 5}


def test_spans_off_keeps_metrics() -> None:
    out = Rig(spans=False).run(memcpy(), call_stats(), call_stats(rc=35))
    assert not spans(out)
    assert metrics(out, "gpu.cuda.memory.copies") and metrics(out, "gpu.cuda.api.errors")


# ---- pipeline contract -------------------------------------------------------------------

def test_other_events_pass_through_unchanged_and_in_order() -> None:
    lib = LibraryLoaded(PID, TID, T0, "/x/libcudart.so.12")
    other = object()
    exit_ = ProcessExit(PID, T0, "x", 0)
    out = Rig().run(lib, other, exit_)
    assert out[0] is lib and out[1] is other and out[2] is exit_


def test_bad_event_is_counted_and_the_batch_goes_on() -> None:
    rig = Rig()
    bad = AllocCall(PID, TID, "cudaMalloc", 0, T0, T0, 0, None, 1, 0, 0)  # type: ignore[arg-type]
    out = rig.run(bad, memcpy())
    assert [s.name for s in spans(out)] == ["cudaMemcpyAsync"]
    assert rig.ctx.telemetry.get(DROPPED, receiver="cuda", reason="bad_event") == 1


def test_lifecycle_and_factory() -> None:
    assert factory.type == "cuda" and factory.config_class is Config
    proc = factory.create(build(Config, {}), Context(), ListConsumer())
    proc.shutdown()  # without start
    proc.start()
    proc.shutdown()
    proc.shutdown()
    with pytest.raises(ConfigError, match="max_tracked_allocations"):
        build(Config, {"max_tracked_allocations": 0}, "processors.cuda")
    with pytest.raises(ConfigError, match=r"processors\.cuda\.nope"):
        build(Config, {"nope": 1}, "processors.cuda")


# ---- through the real emitter -------------------------------------------------------------

class StoringMetricExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.exports: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _points(data: list[MetricsData], pid: int) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for md in data:
        for rm in md.resource_metrics:
            if rm.resource.attributes.get("process.pid") != pid:
                continue
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_exported_spans_and_metrics_through_the_emitter() -> None:
    spans_out, metrics_out = InMemorySpanExporter(), StoringMetricExporter()
    telemetry = Telemetry()
    emitter = Emitter([ExporterSpec("mem", spans_out, metrics_out, batch_delay=0.05)], telemetry,
                      resource_of=lambda pid, comm: {"process.pid": pid, "service.name": "train"},
                      agent_attributes={"service.name": "otel-ebpf"}, metrics_interval=3600.0, exit_grace=0.0)
    proc = CudaProcessor(Config(), Context(telemetry=telemetry), emitter)
    try:
        proc.consume([
            SetDeviceCall(PID, TID, "cudaSetDevice", 1, T0, T0 + 10, 0, 1),
            malloc(PTR, 1 << 20), malloc(PTR + 0x100000, 4096),
            memcpy(), memcpy(rc=35, api="cudaMemcpy"), call_stats("cudaMemcpy", rc=35, calls=2),
            call_stats(calls=5, durs_ns=(5000, 50_000)),
            KernelLaunchStats(PID, 1, 42, 256, 1000, T0),
            free(PTR),
        ])
        proc.consume([ProcessExit(PID, T0 + 10**9, "train", 0)])
        emitter.flush()
        got = {s.name: s for s in spans_out.get_finished_spans()}
        assert set(got) == {"cudaSetDevice", "cudaMalloc", "cudaMemcpyAsync", "cudaMemcpy", "cudaFree"}
        failed = got["cudaMemcpy"]
        assert failed.status.status_code == StatusCode.ERROR
        assert failed.status.description == "cudaErrorInsufficientDriver"
        assert got["cudaMemcpyAsync"].status.status_code == StatusCode.UNSET
        assert dict(got["cudaMemcpyAsync"].attributes or {}) == {
            "cuda.api": "cudaMemcpyAsync", "cuda.device.index": 1, "cuda.return_code": 0,
            "thread.id": TID, "cuda.bytes": 32768, "cuda.memcpy.kind": "DeviceToHost", "cuda.stream": "0xabc"}
        assert got["cudaFree"].attributes["cuda.ptr"] == hex(PTR)  # type: ignore[index]
        assert (got["cudaMemcpyAsync"].start_time, got["cudaMemcpyAsync"].end_time) == (T0, T0 + 5000)
        assert {s.instrumentation_scope.name for s in got.values() if s.instrumentation_scope} == {"otel_ebpf.cuda"}
        assert got["cudaFree"].resource.attributes["process.pid"] == PID

        points = _points(metrics_out.exports, PID)
        assert [p.value for p in points["gpu.cuda.memory.leaked"]] == [4096]
        assert [p.value for p in points["gpu.cuda.memory.leaked.allocations"]] == [1]
        assert [p.value for p in points["gpu.cuda.memory.outstanding"]] == [4096]
        assert [p.value for p in points["gpu.cuda.kernel.launch.calls"]] == [1000]
        (grid,) = points["gpu.cuda.kernel.grid.size"]
        assert isinstance(grid, HistogramDataPoint) and (grid.count, grid.sum) == (1000, 42 * 1000)
        (errors,) = points["gpu.cuda.api.errors"]
        assert dict(errors.attributes) == {"cuda.api": "cudaMemcpy", "error.type": "cudaErrorInsufficientDriver",
                                           "cuda.device.index": 1}
        assert errors.value == 2
        (copies,) = points["gpu.cuda.memory.copies"]  # kernel buckets merged as they are, no min/max
        assert isinstance(copies, HistogramDataPoint) and (copies.count, copies.sum) == (5, 5 * 32768)
        assert sum(copies.bucket_counts) == 5 and copies.min is None and copies.max is None
        durations = {p.attributes.get("error.type"): p for p in points["gpu.cuda.memory.copy.duration"]}
        assert durations[None].count == 5 and durations["cudaErrorInsufficientDriver"].count == 2
        assert emitter.process_count() == 0  # the exited process was exported once more and released
    finally:
        emitter.shutdown()


def test_leak_report_waits_for_the_cuda_receivers_own_exit_record() -> None:
    rig = Rig()
    rig.run(malloc(PTR, 4096, device=0))
    other = ProcessExit(PID, T0 + 10, "train", 0, source="nccl")
    assert rig.run(other) == [other]  # passed on, no report: CUDA records may still be coming
    rig.run(free(PTR))  # a late free of the same process
    out = rig.run(ProcessExit(PID, T0 + 20, "train", 0, source="cuda"))
    assert metrics(out, "gpu.cuda.memory.leaked") == []  # nothing leaked after all


# ---- nesting under the Python function / PyTorch operator that issued the call ----------------

def test_call_inside_a_torch_op_is_a_child_of_that_op_span_in_its_trace() -> None:
    from otel_ebpf.processors.torch import Config as TorchConfig
    from otel_ebpf.processors.torch import TorchProcessor
    from otel_ebpf.receivers.cuda.events import EnclosingCall
    from otel_ebpf.receivers.torch.events import TorchOp

    linear = TorchOp(PID, TID, "linear", 0, T0 - 900, T0 + 9000, 0, T0 - 900)
    addmm = TorchOp(PID, TID, "addmm", 1, T0 - 500, T0 + 8000, T0 - 900, T0 - 900)
    call = MemcpyCall(PID, TID, "cudaMemcpyAsync", 1, T0, T0 + 5000, 0, 0x1000, 0x2000, 64, 0xABC, 1,
                      enclosing=EnclosingCall("torch", addmm.start_ns, linear.start_ns))
    out = ListConsumer()
    chain = TorchProcessor(TorchConfig(), Context(), CudaProcessor(Config(), Context(), out))
    chain.consume([call, addmm, linear])  # children come first: the parent returns later
    by_name = {s.name: s for s in spans(out.events)}
    assert by_name["addmm"].parent_span_id == by_name["linear"].span_id
    copy = by_name["cudaMemcpyAsync"]
    assert copy.parent_span_id == by_name["addmm"].span_id
    assert copy.trace_id == by_name["addmm"].trace_id == by_name["linear"].trace_id


def test_enclosing_call_wins_over_the_app_span_and_the_app_span_stays_for_the_rest() -> None:
    from otel_ebpf.processors.python import call_ids
    from otel_ebpf.receivers.apptrace.store import AppContextStore
    from otel_ebpf.receivers.cuda.events import EnclosingCall

    rig = Rig()
    rig.ctx.app_context = store = AppContextStore(Telemetry())
    store.begin(PID, TID, T0 - 10_000, 0xAAA, 0xBBB)
    inside = MemcpyCall(PID, TID, "cudaMemcpy", 1, T0, T0 + 5, 0, 1, 2, 3, 0, 1,
                        enclosing=EnclosingCall("python", T0 - 100, T0 - 200))
    plain = MemcpyCall(PID, TID, "cudaMemcpy", 1, T0 + 10, T0 + 15, 0, 1, 2, 3, 0, 1)
    first, second = spans(rig.run(inside, plain))
    trace_id, span_id = call_ids(PID, TID, T0 - 100, T0 - 200)
    assert (first.trace_id, first.parent_span_id) == (trace_id, span_id)
    assert (second.trace_id, second.parent_span_id) == (0xAAA, 0xBBB)


def test_sampled_launch_nests_and_launch_counts_carry_the_operator() -> None:
    from otel_ebpf.processors.torch import op_ids
    from otel_ebpf.receivers.cuda.events import EnclosingCall

    launch = KernelLaunch(PID, TID, "cudaLaunchKernel", 0, T0, 0x4010, (5, 1, 1), (64, 1, 1), 0, 0, 1,
                          enclosing=EnclosingCall("torch", T0 - 50, T0 - 80))
    records = Rig().run(launch, KernelLaunchStats(PID, 0, 5, 64, 3, T0, "addmm"),
                        KernelLaunchStats(PID, 0, 5, 64, 2, T0))
    (span,) = spans(records)
    assert (span.trace_id, span.parent_span_id) == op_ids(PID, TID, T0 - 50, T0 - 80)
    calls = metrics(records, "gpu.cuda.kernel.launch.calls")
    assert [(m.value, m.attributes.get("pytorch.op.name")) for m in calls] == [(3, "addmm"), (2, None)]
    assert all("pytorch.op.name" not in m.attributes for m in metrics(records, "gpu.cuda.kernel.grid.size"))


def test_operator_names_of_launch_counters_come_from_the_torch_receiver_of_the_same_context() -> None:
    from otel_ebpf.bpf import threadctx
    ctx, other = Context(), Context()
    threadctx.register_ops(ctx, lambda pid, ip: "addmm" if (pid, ip) == (PID, 0x4000) else None)
    try:
        assert threadctx.op_name(ctx, PID, 0x4000) == "addmm"
        assert threadctx.op_name(ctx, PID, 0x4001) is None
        assert threadctx.op_name(other, PID, 0x4000) is None  # another agent's torch receiver
    finally:
        threadctx.unregister_ops(ctx)
    assert threadctx.op_name(ctx, PID, 0x4000) is None


# ---- stream capture: recorded into a graph, not run ------------------------------------------
def test_captured_launches_are_counted_apart_and_out_of_the_launch_shape_histograms() -> None:
    out = Rig().run(KernelLaunchStats(PID, 0, 4, 128, 7, T0, api="cudaLaunchKernel", captured=True),
                    KernelLaunchStats(PID, 0, 4, 128, 2, T0, api="cudaLaunchKernel"))
    calls = {m.attributes.get("cuda.graph.captured", False): m.value
             for m in metrics(out, "gpu.cuda.kernel.launch.calls")}
    assert calls == {True: 7, False: 2}
    (grid,) = metrics(out, "gpu.cuda.kernel.grid.size")
    assert grid.count == 2 and "cuda.graph.captured" not in grid.attributes


def test_captured_calls_mark_their_spans_and_metrics() -> None:
    import dataclasses

    copy = dataclasses.replace(memcpy(), captured=True)
    stats = dataclasses.replace(call_stats(), captured=True)
    out = Rig().run(copy, stats, memcpy())
    marked = [s.attributes.get("cuda.graph.captured") for s in spans(out)]
    assert marked == [True, None]
    (copies,) = metrics(out, "gpu.cuda.memory.copies")
    assert copies.attributes["cuda.graph.captured"] is True
    begin = call_stats("cudaStreamBeginCapture", sizes=(0,))
    (counted,) = metrics(Rig().run(begin), "gpu.cuda.api.calls")
    assert counted.attributes["cuda.api"] == "cudaStreamBeginCapture" and counted.value == 1


# ---- memcpy, synchronize and graph-launch spans take the batch path: the same spans as the general one ----------
class _Gpus:
    """A GPU table that answers for device 1 only, and counts its lookups."""

    def __init__(self) -> None:
        self.asked = 0

    def hw_id(self, pid: int, ordinal: int) -> str | None:
        self.asked += 1
        return "GPU-1111" if ordinal == 1 else None

    def forget(self, pid: int) -> None:
        pass


def _calls() -> list[object]:
    enc = EnclosingCall("torch", T0 - 100, T0 - 200)
    out: list[object] = []
    for i, api in enumerate(("cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpyAsync_ptsz", "cuMemcpyHtoD_v2")):
        for device in (-1, 0, 1):
            out.append(MemcpyCall(PID + i % 2, TID, api, device, T0 + i, T0 + i + 9, 0, 1, 2, 64 << i, 0xAB, i % 5,
                                  enclosing=enc if i % 2 else None, captured=device == 0))
    for api in ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize_ptsz"):
        out.append(SyncCall(PID, TID, api, 1, T0, T0 + 5, 0, 0xCD, enclosing=enc))
    out.append(GraphLaunchCall(PID, TID, "cudaGraphLaunch", 1, T0, T0 + 5, 0, 0xEF, 0x12))
    out.append(MemcpyCall(PID, TID, "cudaMemcpy", 1, T0, T0 + 5, 0, 1, 2, 3, 0, 77))  # a kind CUDA has no name for
    for rc in (35, 700, 999999):  # failed: insufficient driver, illegal address, a code CUDA has no name for
        out.append(MemcpyCall(PID, TID, "cudaMemcpyAsync", 1, T0, T0 + 5, rc, 1, 2, 3, 0xAB, 1))
        out.append(SyncCall(PID, TID, "cudaStreamSynchronize", 0, T0, T0 + 5, rc, 0xCD, enclosing=enc))
        out.append(GraphLaunchCall(PID, TID, "cudaGraphLaunch", 1, T0, T0 + 5, rc, 0xEF, 0x12))
    return out


@pytest.mark.parametrize("app_store", [False, True], ids=["no_app_spans", "app_spans"])
def test_counted_calls_make_the_spans_the_general_path_makes_attribute_for_attribute(app_store: bool) -> None:
    class Store:
        def lookup(self, pid: int, tid: int, time_ns: int) -> tuple[int, int] | None:
            return (0xA11, 0xB22) if pid == PID else None

    made = []
    for fast in (True, False):
        rig = Rig()
        rig.ctx.gpus = gpus = _Gpus()
        rig.ctx.app_context = Store() if app_store else None  # type: ignore[assignment]
        rig.proc = CudaProcessor(Config(), rig.ctx, rig.out)
        rig.proc._fast = fast
        made.append((spans(rig.run(*_calls())), gpus.asked))
    (fast_spans, fast_asked), (general, general_asked) = made
    assert len(fast_spans) == len(general) == len(_calls()) and sum(1 for x in general if x.error) == 9
    for a, b in zip(fast_spans, general, strict=True):
        assert list(a.attributes.items()) == list(b.attributes.items())  # the same attributes in the same order
        assert a == b
    assert fast_asked == 7 < general_asked  # one GPU lookup per (pid, device, captured) in the batch


def test_the_gpu_table_is_asked_again_in_the_next_batch() -> None:
    rig = Rig()
    rig.ctx.gpus = gpus = _Gpus()
    rig.proc = CudaProcessor(Config(), rig.ctx, rig.out)
    rig.run(memcpy(), memcpy())
    rig.run(memcpy())
    assert gpus.asked == 2
