"""cuda.h as gcc lays it out == the Python mirrors in otel_ebpf/receivers/cuda/receiver.py; decoding
through those mirrors; the receiver config as it reaches the program.

A small C program includes cuda.h (with a u8/u32/s32/u64 shim for the kernel types) and
prints sizeof, offsetof and member sizes of every mirrored struct, the record type values
and the CUDA_API_* ids; the test compares them with the struct formats, types and APIS.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.cuda import Config, factory
from otel_ebpf.receivers.cuda import receiver as cuda_receiver
from otel_ebpf.receivers.cuda.events import AllocCall, EnclosingCall, KernelLaunch, MemcpyCall, SetDeviceCall
from otel_ebpf.receivers.cuda.receiver import (
    ALLOC,
    APIS,
    LAUNCH,
    MEMCPY,
    MIRRORS,
    PROBES,
    SET_DEVICE,
    CudaReceiver,
)
from otel_ebpf.bpf.records import Mirror, format_offsets
from otel_ebpf.core.telemetry import DROPPED

CUDA_DIR = Path(cuda_receiver.__file__).resolve().parent
SHIM = ("typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef int s32; "
        "typedef unsigned long long u64;\n")


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is needed to check cuda.h against its Python mirrors")
        pytest.skip("gcc not found")
    lines = []
    for m in MIRRORS:
        lines.append(f'printf("sizeof {m.c_struct} %zu\\n", sizeof(struct {m.c_struct}));')
        for f in m.fields:
            member = f"((struct {m.c_struct} *)0)->{f}"
            lines.append(f'printf("offsetof {m.c_struct} {f} %zu %zu\\n", '
                         f'__builtin_offsetof(struct {m.c_struct}, {f}), sizeof({member}));')
    for a in APIS:
        lines.append(f'printf("api {a.symbol} %d\\n", CUDA_API_{a.symbol});')
    lines.append('printf("api_count %d\\n", CUDA_API_COUNT);')
    for name in ("MEMCPY", "ALLOC", "FREE", "SYNC", "SET_DEVICE", "LAUNCH", "GRAPH", "KERNEL"):
        lines.append(f'printf("etype {name} %d\\n", CUDA_EV_{name});')
    for kind in ("PYTHON", "TORCH"):
        lines.append(f'printf("ctx {kind} %d\\n", CUDA_CTX_{kind});')
    src = (f'#include <stdio.h>\n{SHIM}#include "cuda.h"\nint main(void)\n{{\n    '
           + "\n    ".join(lines) + "\n    return 0;\n}\n")
    tmp = tmp_path_factory.mktemp("cuda_layout")
    (tmp / "layout.c").write_text(src)
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{CUDA_DIR}", "-o", str(tmp / "layout"),
                    str(tmp / "layout.c")], check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(tmp / "layout")], check=True, capture_output=True, text=True, timeout=10).stdout
    values: dict[str, int] = {}
    for line in out.splitlines():
        words = line.split()
        if words[0] == "offsetof":  # offsetof STRUCT FIELD OFFSET SIZE
            key = " ".join(words[:3])
            values[key], values[key + " size"] = int(words[3]), int(words[4])
        else:
            values[" ".join(words[:-1])] = int(words[-1])
    return values


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_mirror_matches_c_layout(mirror: Mirror, c_layout: dict[str, int]) -> None:
    assert mirror.fmt.format.startswith("<")
    assert mirror.fmt.size == c_layout[f"sizeof {mirror.c_struct}"]
    offsets = format_offsets(mirror.fmt)
    assert len(offsets) == len(mirror.fields)
    for (offset, size), field in zip(offsets, mirror.fields, strict=True):
        key = f"offsetof {mirror.c_struct} {field}"
        assert (offset, size) == (c_layout[key], c_layout[key + " size"]), field


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_records_start_with_their_type_byte(mirror: Mirror, c_layout: dict[str, int]) -> None:
    assert mirror.fields[0].endswith("type") and format_offsets(mirror.fmt)[0] == (0, 1)
    name = {"cuda_memcpy_rec": "MEMCPY", "cuda_alloc_rec": "ALLOC", "cuda_free_rec": "FREE",
            "cuda_sync_rec": "SYNC", "cuda_set_device_rec": "SET_DEVICE",
            "cuda_launch_rec": "LAUNCH", "cuda_graph_rec": "GRAPH", "cuda_kernel_rec": "KERNEL"}[mirror.c_struct]
    assert mirror.etype == c_layout[f"etype {name}"] >= 16
    raw = bytes([mirror.etype]) + bytes(mirror.fmt.size - 1)
    assert mirror.fmt.unpack_from(raw)[0] == mirror.etype


def test_record_types_are_distinct() -> None:
    assert len({m.etype for m in MIRRORS}) == len(MIRRORS)


def test_api_ids_match_cuda_h(c_layout: dict[str, int]) -> None:
    assert c_layout["api_count"] == len(APIS)
    for index, api in enumerate(APIS):
        assert c_layout[f"api {api.symbol}"] == index, api.symbol


def test_every_probe_function_is_defined_in_the_program() -> None:
    text = (CUDA_DIR / "cuda.bpf.c").read_text()
    defined = set(re.findall(r"^int (\w+)\(struct pt_regs \*ctx\)", text, re.M))
    for sym in re.findall(r"^CUDA_CALL\((\w+), \w+\)", text, re.M):
        defined |= {f"enter_{sym}", f"return_{sym}"}
    wanted = {fn for p in PROBES for fn in (p.entry, p.ret) if fn}
    assert wanted <= defined, wanted - defined
    # kernel launches are entry-only: no uretprobe on the hot path (a graph replay is a completed call)
    assert all(p.ret is None for p in PROBES if p.symbol.startswith("cudaLaunch"))
    assert all(p.ret is not None for p in PROBES if p.symbol.startswith("cudaGraphLaunch"))


def _receiver() -> CudaReceiver:
    return CudaReceiver(Config(), Context(), ListConsumer())  # decode needs no BPF


def test_decode_call_records_into_typed_events_with_epoch_times() -> None:
    r = _receiver()
    off = r.clock.offset_ns
    memcpy_id = [a.symbol for a in APIS].index("cudaMemcpyAsync_ptsz")
    raw = MEMCPY.fmt.pack(16, memcpy_id, 0, 0, 1, 10, 11, 1000, 2000, 0, 0, 0, 0xD, 0x5, 4096, 0x77, 2)
    assert r.decode(16, raw) == MemcpyCall(10, 11, "cudaMemcpyAsync_ptsz", 1, 1000 + off, 2000 + off, 0,
                                           0xD, 0x5, 4096, 0x77, 2)
    raw = ALLOC.fmt.pack(17, 8, 0, 0, -1, 10, 11, 5, 6, 35, 0, 0, 0, 1 << 20, 0, 0)
    assert r.decode(17, raw) == AllocCall(10, 11, "cudaMalloc", -1, 5 + off, 6 + off, 35, 0, 1 << 20, 0, 0)
    raw = SET_DEVICE.fmt.pack(20, 19, 0, 0, 3, 10, 11, 5, 6, 0, 0, 0, 3)
    assert r.decode(20, raw) == SetDeviceCall(10, 11, "cudaSetDevice", 3, 5 + off, 6 + off, 0, 3)
    raw = LAUNCH.fmt.pack(21, 2, 0, 0, 0, 10, 11, 7, 0x4010, 5, 1, 1, 64, 1, 1, 512, 0, 9, 0, 0)
    assert r.decode(21, raw) == KernelLaunch(10, 11, "cudaLaunchKernelExC", 0, 7 + off, 0x4010, (5, 1, 1),
                                             (64, 1, 1), 512, 0, 9)
    # recorded into a graph during a stream capture: the record's captured byte
    raw = MEMCPY.fmt.pack(16, memcpy_id, 0, 1, 1, 10, 11, 1000, 2000, 0, 0, 0, 0xD, 0x5, 4096, 0x77, 2)
    assert r.decode(16, raw) == MemcpyCall(10, 11, "cudaMemcpyAsync_ptsz", 1, 1000 + off, 2000 + off, 0,
                                           0xD, 0x5, 4096, 0x77, 2, captured=True)


def test_decode_carries_the_enclosing_python_or_torch_call_in_epoch_time(c_layout: dict[str, int]) -> None:
    r = _receiver()
    off = r.clock.offset_ns
    memcpy_id = [a.symbol for a in APIS].index("cudaMemcpy")
    python, torch = c_layout["ctx PYTHON"], c_layout["ctx TORCH"]
    raw = MEMCPY.fmt.pack(16, memcpy_id, python, 0, 0, 10, 11, 1000, 2000, 0, 900, 500, 0xD, 0x5, 64, 0, 1)
    ev = r.decode(16, raw)
    assert isinstance(ev, MemcpyCall) and ev.enclosing == EnclosingCall("python", 900 + off, 500 + off)
    raw = LAUNCH.fmt.pack(21, 0, torch, 0, 0, 10, 11, 7, 0x4010, 5, 1, 1, 64, 1, 1, 512, 0, 9, 6, 3)
    ev = r.decode(21, raw)
    assert isinstance(ev, KernelLaunch) and ev.enclosing == EnclosingCall("torch", 6 + off, 3 + off)


def test_receivers_of_one_process_convert_kernel_time_alike() -> None:
    """The enclosing call's start is converted by the cuda receiver, its own event by the
    python/torch receiver: the same epoch ns, or their derived span ids would differ."""
    from otel_ebpf.receivers.python import Config as PyConfig
    from otel_ebpf.receivers.python.receiver import PythonReceiver

    ctx = Context()  # the receivers of one agent share its context, and so its one kernel clock
    cuda = CudaReceiver(Config(), ctx, ListConsumer())
    python = PythonReceiver(PyConfig(), ctx, ListConsumer())
    assert cuda.clock is python.clock and cuda.clock.to_epoch_ns(123) == python.clock.to_epoch_ns(123)


@pytest.mark.parametrize("raw", [b"\x10" + bytes(10), MEMCPY.fmt.pack(16, 200, *([0] * 15)),
                                 MEMCPY.fmt.pack(16, 4, 7, 0, *([0] * 13))],
                         ids=["short", "bad_api", "bad_context_kind"])
def test_malformed_records_are_counted_not_raised(raw: bytes) -> None:
    r = _receiver()
    r._on_raw(raw)  # never raises: counted
    assert r.ctx.telemetry.get(DROPPED, receiver="cuda", reason="decode_error") == 1


def test_receiver_config_defaults_reach_the_program_as_macros() -> None:
    ctx = Context(target_pids=[1], thread_ctx_writers={"torch"})  # a torch receiver in the same agent
    r = CudaReceiver(build(Config, {"launch_sample_every": 7, "max_inflight": 99}), ctx, ListConsumer())
    flags = r.program_cflags()
    for flag in ("-DCUDA_LAUNCH_SAMPLE_EVERY=7", "-DCUDA_MAX_INFLIGHT=99", "-DCUDA_MAX_THREADS=65536",
                 "-DCUDA_MAX_LAUNCH_KEYS=4096", "-DOE_PAUSE_ON_LOAD=1", "-DOE_FILTER_PIDS=1",
                 '-DOE_LIB_PATTERN="libcuda"', "-DOE_THREAD_CTX=1", "-DCUDA_LAUNCH_CONTEXT=1"):
        assert flag in flags
    off = CudaReceiver(build(Config, {"nesting": False}), Context(thread_ctx_writers={"torch"}),
                       ListConsumer()).program_cflags()
    # the map stays (it keeps stream captures); the call slots are not read
    assert "-DOE_THREAD_CTX=1" in off and "-DCUDA_CALL_CONTEXT=0" in off and "-DCUDA_LAUNCH_CONTEXT=0" in off
    fast = CudaReceiver(build(Config, {"launch_context": False}), Context(thread_ctx_writers={"python"}),
                        ListConsumer()).program_cflags()
    assert "-DCUDA_CALL_CONTEXT=1" in fast and "-DCUDA_LAUNCH_CONTEXT=0" in fast
    # nesting on, but no python/torch receiver writes the map: no lookup on any call
    alone = CudaReceiver(build(Config, {}), Context(), ListConsumer()).program_cflags()
    assert "-DCUDA_CALL_CONTEXT=0" in alone and "-DCUDA_LAUNCH_CONTEXT=0" in alone
    assert r.library_key == "cudart" and factory.type == "cuda" and factory.config_class is Config


def test_call_histogram_bounds_are_the_emitters() -> None:
    """The kernel buckets call durations and sizes over the emitter's own bounds, so its bucket
    counts merge as they are (otel_ebpf.emit.histograms.HistogramStore)."""
    from otel_ebpf.core.buckets import bounds_for_unit
    from otel_ebpf.receivers.cuda.receiver import BYTES_BOUNDS, DUR_BOUNDS_NS

    flags = CudaReceiver(build(Config, {"span_rate_limit": 50, "always_span_slower_than": "2ms"}), Context(),
                         ListConsumer()).program_cflags()
    assert [b / 1e9 for b in DUR_BOUNDS_NS] == pytest.approx(list(bounds_for_unit("s")))
    assert list(BYTES_BOUNDS) == list(bounds_for_unit("By"))
    assert f"-DCUDA_DUR_NBOUNDS={len(bounds_for_unit('s'))}" in flags
    assert "-DCUDA_SPAN_RATE=50" in flags and "-DCUDA_SPAN_SLOW_NS=2000000" in flags


@pytest.mark.parametrize(("data", "key"), [
    ({"ringbuf_pages": 100}, "receivers.cuda.ringbuf_pages"),
    ({"launch_sample_every": -1}, "receivers.cuda.launch_sample_every"),
    ({"max_launch_keys": 0}, "receivers.cuda.max_launch_keys"),
    ({"max_call_keys": 0}, "receivers.cuda.max_call_keys"),
    ({"span_rate_limit": -5}, "receivers.cuda.span_rate_limit"),
    ({"always_span_slower_than": -1}, "receivers.cuda.always_span_slower_than"),
    ({"stats_interval": "1ms"}, "receivers.cuda.stats_interval"),
    ({"symbols": []}, "receivers.cuda.symbols"),
])
def test_receiver_config_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, data, "receivers.cuda")
    assert err.value.path == key
