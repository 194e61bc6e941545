"""otel_ebpf/receivers/nvml: the scrape, through the REAL pynvml bindings, against the stand-in libnvidia-ml.so.1.

The stand-in (tests/support/stand_in_nvml.c, not NVIDIA's library) is mapped into this process
under its soname before pynvml loads NVML, so pynvml's own ``CDLL("libnvidia-ml.so.1")`` binds to
it. It re-reads STAND_IN_NVML_SCENARIO whenever NVML's init count goes 0 -> 1, so each test
writes its scenario and every test shuts NVML down again.
"""
from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers import nvml as nvml_pkg
from otel_ebpf.receivers.nvml import presence
from otel_ebpf.receivers.nvml.metrics import SCRAPE_ERRORS
from otel_ebpf.host.nvml import load
from otel_ebpf.receivers.nvml.receiver import in_traced_tree
from otel_ebpf.receivers.nvml.scrape import Deltas, Scraper
from otel_ebpf.core.telemetry import Telemetry
from tests.support.build import build_stand_in_nvml

DRIVER = "0.0-stand-in"
GPU0 = "GPU-5a1d0000-0000-4000-8000-000000000000"
GPU1 = "GPU-5a1d0000-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def stand_in() -> Path:
    path = build_stand_in_nvml()
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # pynvml's dlopen by soname now finds it
    return path


@pytest.fixture
def nvml(stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], object]]:
    """``nvml(scenario_text)`` -> initialized pynvml on the stand-in with that scenario."""
    inits: list[object] = []

    def start(text: str = "") -> object:
        scenario = tmp_path / f"scenario{len(inits)}.txt"
        scenario.write_text(f"driver {DRIVER}\n{text}")
        monkeypatch.setenv("STAND_IN_NVML_SCENARIO", str(scenario))
        nv, why = load()
        assert nv is not None, why
        inits.append(nv)
        # Bound to the stand-in, not to a real driver's library mapped earlier in this process.
        assert nv.nvmlSystemGetDriverVersion() == DRIVER
        return nv

    yield start
    for nv in inits:
        nv.nvmlShutdown()  # type: ignore[attr-defined]


def by_name(records: list[MetricRecord], name: str, **attrs: object) -> list[MetricRecord]:
    return [r for r in records if r.name == name and all(r.attributes.get(k) == v for k, v in attrs.items())]


def one(records: list[MetricRecord], name: str, **attrs: object) -> MetricRecord:
    found = by_name(records, name, **attrs)
    assert len(found) == 1, (name, attrs, found)
    return found[0]


def test_pynvml_struct_layouts_match_the_stand_in_and_nvml_h() -> None:
    import pynvml

    # The same sizes are _Static_assert-ed in stand_in_nvml.c.
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v2_t) == 24
    assert pynvml.c_nvmlProcessInfo_v3_t is pynvml.c_nvmlProcessInfo_v2_t
    assert ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlEventData_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == 40
    assert ctypes.sizeof(pynvml.nvmlPciInfo_t) == 68


def test_default_scrape_has_exact_values_and_dcgm_joinable_attributes(nvml) -> None:
    nv = nvml("")
    records = Scraper(nv, Telemetry()).scrape()
    util = one(records, "hw.gpu.utilization", **{"hw.id": GPU0, "hw.gpu.task": "general"})
    assert (util.kind, util.value, util.unit, util.pid, util.scope) == ("gauge", 0.40, "1", None, "otel_ebpf.nvml")
    assert {k: util.attributes[k] for k in ("hw.id", "hw.type", "hw.vendor", "hw.model", "hw.driver_version",
                                            "hw.name", "gpu.index", "pci.bus_id")} == {
        "hw.id": GPU0, "hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.model": "Stand-in GPU",
        "hw.driver_version": DRIVER, "hw.name": "nvidia0", "gpu.index": 0, "pci.bus_id": "00000000:00:00.0"}
    assert one(records, "hw.gpu.memory.usage", **{"hw.id": GPU1}).value == 2 << 30
    assert one(records, "hw.gpu.memory.limit", **{"hw.id": GPU0}).value == 80 << 30
    assert one(records, "nvidia.gpu.memory.free", **{"hw.id": GPU0}).value == (80 << 30) - (1 << 30)
    assert one(records, "hw.gpu.memory.utilization", **{"hw.id": GPU0}).value == pytest.approx(1 / 80)
    assert one(records, "nvidia.gpu.memory.activity", **{"hw.id": GPU1}).value == 0.21
    assert one(records, "hw.temperature", **{"hw.id": GPU1}).value == 51
    assert one(records, "hw.power", **{"hw.id": GPU0}).value == 300.0
    assert one(records, "nvidia.gpu.power.limit", **{"hw.id": GPU0}).value == 700.0
    energy = one(records, "hw.energy", **{"hw.id": GPU1})
    assert (energy.kind, energy.unit, energy.value) == ("counter", "J", 123456.790)
    assert one(records, "hw.errors", **{"hw.id": GPU0, "error.type": "pcie_replay"}).value == 0
    assert one(records, "hw.fan.speed_ratio", **{"hw.id": GPU0}).value == 0.30
    assert one(records, "nvidia.gpu.clock.speed", **{"hw.id": GPU0, "nvidia.gpu.clock.domain": "sm"}).value == 1980e6
    assert one(records, "hw.gpu.utilization", **{"hw.id": GPU0, "hw.gpu.task": "decoder"}).value == 0.02
    tx = one(records, "nvidia.gpu.pcie.throughput", **{"hw.id": GPU0, "network.io.direction": "transmit"})
    assert tx.value == 1000 * 1024 and tx.unit == "By/s"
    assert one(records, "hw.errors", **{"hw.id": GPU0, "error.type": "ecc_uncorrected"}).value == 0
    throttled = by_name(records, "nvidia.gpu.clock.throttled", **{"hw.id": GPU0})
    assert len(throttled) == 9 and {r.attributes["nvidia.gpu.clock.throttle_reason"] for r in throttled
                                    if r.value == 1} == {"gpu_idle"}
    assert one(records, "nvidia.gpu.mig.enabled", **{"hw.id": GPU0}).value == 0
    assert one(records, "hw.status", **{"hw.id": GPU0, "hw.state": "ok"}).value == 1
    assert one(records, "otel_ebpf.nvml.scrape.duration", **{"hw.id": GPU0}).kind == "histogram"
    assert not by_name(records, "nvidia.gpu.nvlink.up")  # no NVLink on the default GPUs


def test_updown_and_counter_records_are_deltas(nvml) -> None:
    nv = nvml("")
    scraper = Scraper(nv, Telemetry())
    scraper.scrape()
    again = scraper.scrape()
    assert not by_name(again, "hw.gpu.memory.usage")  # unchanged: no delta to add
    assert not by_name(again, "hw.errors")
    assert by_name(again, "hw.gpu.utilization")  # gauges are always set
    d = Deltas()
    assert (d.counter(("k",), 5), d.counter(("k",), 7), d.counter(("k",), 7), d.counter(("k",), 2)) == (5, 2, None, 2)
    assert (d.updown(("u",), 10), d.updown(("u",), 4), d.updown(("u",), 4)) == (10, -6, None)


def test_per_process_series_land_on_that_process_pid(nvml) -> None:
    me = os.getpid()
    child = subprocess.Popen(["sleep", "30"])  # on the GPU, idle: no utilization sample
    want = {me, child.pid}
    try:
        nv = nvml(f"gpu 0\nproc {me} 1048576\nputil {me} 55 12 3 4\ngproc 999999 4096\nproc {child.pid} 8\n")
        records = Scraper(nv, Telemetry(), want_pid=want.__contains__).scrape()
    finally:
        child.kill()
        child.wait()
    mem = [r for r in records if r.name == "hw.gpu.memory.usage" and r.pid == me]
    assert [(r.value, r.attributes["hw.id"], r.kind) for r in mem] == [(1048576, GPU0, "updown")]
    util = {r.attributes["hw.gpu.task"]: r.value for r in records if r.name == "hw.gpu.utilization" and r.pid == me}
    assert util == {"general": 0.55, "encoder": 0.03, "decoder": 0.04}
    assert [r.value for r in records if r.name == "nvidia.gpu.memory.activity" and r.pid == me] == [0.12]
    assert not [r for r in records if r.pid == 999999]  # not wanted
    idle = {r.attributes["hw.gpu.task"]: r.value for r in records if r.name == "hw.gpu.utilization"
            and r.pid == child.pid}
    assert idle == {"general": 0.0, "encoder": 0.0, "decoder": 0.0}


def test_traced_tree_filter_follows_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert in_traced_tree(child.pid, [os.getpid()])
        assert not in_traced_tree(child.pid, [os.getpid()], follow_children=False)
        assert not in_traced_tree(os.getpid(), [child.pid])
    finally:
        child.kill()
        child.wait()


def test_partial_scrape_counts_errors_and_keeps_the_rest(nvml) -> None:
    nv = nvml("fail nvmlDeviceGetFanSpeed NOT_SUPPORTED\n"
              "fail nvmlDeviceGetCurrentClocksEventReasons FUNCTION_NOT_FOUND\n"
              "gpu 1\nlost 1\n")
    telemetry = Telemetry()
    scraper = Scraper(nv, telemetry)
    first, second = scraper.scrape(), scraper.scrape()
    assert one(first, "hw.temperature", **{"hw.id": GPU0}).value == 50  # GPU 0 still read in full
    assert not by_name(first, "hw.fan.speed_ratio")
    # r535's ...ClocksEventReasons missing: the older ...ClocksThrottleReasons answers instead.
    assert len(by_name(first, "nvidia.gpu.clock.throttled", **{"hw.id": GPU0})) == 9
    assert one(first, "hw.status", **{"hw.id": GPU1, "hw.state": "failed"}).value == 1
    assert one(first, "hw.status", **{"hw.id": GPU1, "hw.state": "ok"}).value == 0
    assert not by_name(first + second, "hw.temperature", **{"hw.id": GPU1})
    # Missing functions are counted once (then remembered); a lost GPU once per scrape.
    assert telemetry.get(SCRAPE_ERRORS, function="nvmlDeviceGetFanSpeed", error="NotSupported") == 1
    assert telemetry.get(SCRAPE_ERRORS, function="nvmlDeviceGetCurrentClocksEventReasons",
                         error="FunctionNotFound") == 1
    assert telemetry.get(SCRAPE_ERRORS, error="GpuIsLost") == 3  # discovery probe + 2 scrapes


def test_nvlink_mig_and_pcie_byte_counters(nvml) -> None:
    nv = nvml("gpu 0\nnvlink_links 2\nnvlink_up_mask 0x2\nnvlink_tx_kib 3\nnvlink_rx_kib 5\n"
              "pcie_tx_bytes 1000\npcie_rx_bytes 2000\n"
              "mig 1\nmig_instance 1 0 MIG-aaaa 1024 512\nmig_instance 2 0 MIG-bbbb 2048 0\n")
    records = Scraper(nv, Telemetry()).scrape()
    up = {r.attributes["nvidia.gpu.nvlink.link"]: r.value for r in by_name(records, "nvidia.gpu.nvlink.up")}
    assert up == {0: 0, 1: 1}
    assert one(records, "nvidia.gpu.nvlink.io", **{"network.io.direction": "receive"}).value == 5 * 1024
    assert one(records, "hw.gpu.io", **{"hw.id": GPU0, "network.io.direction": "transmit"}).value == 1000
    mig = one(records, "hw.gpu.memory.usage", **{"hw.id": "MIG-aaaa"})
    assert (mig.value, mig.attributes["hw.parent"], mig.attributes["nvidia.gpu.mig.gpu_instance_id"]) == (512, GPU0, 1)
    assert one(records, "nvidia.gpu.mig.instances", **{"hw.id": GPU0}).value == 2
    assert one(records, "nvidia.gpu.mig.enabled", **{"hw.id": GPU0}).value == 1


def test_receiver_counts_an_xid_with_one_warning(nvml, stand_in, caplog) -> None:
    nvml("gpu 1\nxid 79\n")  # holds one init, so the receiver's own init keeps this scenario
    consumer, ctx = ListConsumer(), Context()
    cfg = nvml_pkg.Config(interval=60, event_wait=0.05, processes="none")
    receiver = nvml_pkg.factory.create(cfg, ctx, consumer)
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.receivers.nvml"):
        receiver.start()
        assert receiver.ready.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not by_name(consumer.events, "hw.errors", **{"error.type": "xid_79"}):
            time.sleep(0.02)
        t0 = time.monotonic()
        receiver.shutdown()
        assert time.monotonic() - t0 < 5  # the event thread's wait is bounded
    xid = one(consumer.take(), "hw.errors", **{"error.type": "xid_79"})
    assert (xid.value, xid.kind, xid.attributes["hw.id"], xid.pid) == (1, "counter", GPU1, None)
    warnings = [r.getMessage() for r in caplog.records if "XID" in r.getMessage()]
    assert warnings == [f"nvml: XID 79 on GPU {GPU1} (nvidia1, 00000000:01:00.0): GPU has fallen off the bus"]


def fake_pci(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A /sys/bus/pci/devices stand-in: address -> (vendor, class) files, as sysfs writes them."""
    for address, (vendor, klass) in devices.items():
        (root / address).mkdir(parents=True)
        (root / address / "vendor").write_text(f"{vendor}\n")
        (root / address / "class").write_text(f"{klass}\n")
    return root


def test_nvidia_gpus_are_the_nvidia_display_controllers_on_the_pci_bus(tmp_path) -> None:
    root = fake_pci(tmp_path / "devices", {
        "0000:3b:00.0": ("0x10de", "0x030200"),  # H100: 3D controller
        "0000:01:00.0": ("0x10de", "0x030000"),  # a workstation GPU: VGA controller
        "0000:01:00.1": ("0x10de", "0x040300"),  # its HDMI audio function: not a GPU
        "0000:00:02.0": ("0x8086", "0x030000"),  # Intel graphics
        "0000:00:03.0": ("0x1af4", "0x020000")})  # virtio-net
    assert presence.nvidia_gpus(root) == ["0000:01:00.0", "0000:3b:00.0"]
    assert presence.nvidia_gpus(tmp_path / "no-sysfs") == []


@pytest.mark.parametrize("gpu_on_pci", [False, True])
def test_driver_not_loaded_is_info_without_a_gpu_and_a_warning_with_one(nvml, stand_in, tmp_path, monkeypatch,
                                                                        caplog, gpu_on_pci) -> None:
    scenario = tmp_path / "no_driver.txt"
    scenario.write_text("init_error DRIVER_NOT_LOADED\n")
    monkeypatch.setenv("STAND_IN_NVML_SCENARIO", str(scenario))
    monkeypatch.setattr(presence, "PCI_DEVICES", fake_pci(tmp_path / "devices", {
        "0000:00:02.0": ("0x8086", "0x030000"), **({"0000:3b:00.0": ("0x10de", "0x030200")} if gpu_on_pci else {})}))
    receiver = nvml_pkg.factory.create(nvml_pkg.Config(), Context(), ListConsumer())
    with caplog.at_level(logging.INFO, logger="otel_ebpf.receivers.nvml"):
        receiver.start()
        assert receiver.ready.wait(10)
        receiver.shutdown()
    assert receiver.disabled and "driver is not loaded" in receiver.disabled
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    if gpu_on_pci:
        assert lines == [("WARNING", "nvml receiver disabled, no GPU metrics although this host has 1 NVIDIA "
                                     f"GPU(s) (0000:3b:00.0): {receiver.disabled}")]
    else:
        assert lines == [("INFO", f"no NVIDIA driver/GPU: NVML metrics off: {receiver.disabled}")]


def test_without_nvml_the_receiver_says_so_once_and_stays_idle() -> None:
    """A fresh interpreter without the stand-in: pynvml finds no libnvidia-ml.so.1 at all. Without an
    NVIDIA GPU on the PCI bus that is one INFO line; with one (a GPU host missing its driver), a warning."""
    code = ("import logging, threading, time; logging.basicConfig(level='INFO', format='%(levelname)s %(message)s')\n"
            "from otel_ebpf.receivers import nvml; from otel_ebpf.core.pipeline import Context, ListConsumer\n"
            "r = nvml.factory.create(nvml.Config(), Context(), ListConsumer()); t0 = time.perf_counter()\n"
            "r.start(); assert r.ready.wait(10); r.shutdown(); r.shutdown()\n"
            "print('threads', sorted(t.name for t in threading.enumerate()))\n"
            "print('took', time.perf_counter() - t0)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                       cwd=Path(__file__).resolve().parents[3])
    assert r.returncode == 0, r.stderr
    if "libnvidia-ml.so.1 was not found" not in r.stderr:
        pytest.skip("this host has a real libnvidia-ml.so.1")
    why = "libnvidia-ml.so.1 was not found (no NVIDIA driver on this host)"
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("INFO", "WARNING", "ERROR")) and "nvml" in ln.lower()]
    on_pci = presence.nvidia_gpus()
    if on_pci:
        assert lines == [f"WARNING nvml receiver disabled, no GPU metrics although this host has {len(on_pci)} "
                         f"NVIDIA GPU(s) ({', '.join(on_pci[:4])}): {why}"]
    else:
        assert lines == [f"INFO no NVIDIA driver/GPU: NVML metrics off: {why}"]
    assert "threads ['MainThread']" in r.stdout
    assert float(r.stdout.split("took ")[1]) < 2.0


def test_lifecycle_is_safe_without_start_and_twice(nvml) -> None:
    receiver = nvml_pkg.factory.create(nvml_pkg.Config(), Context(), ListConsumer())
    receiver.shutdown()
    receiver.shutdown()
    receiver.start()  # after shutdown: stays stopped
    assert receiver.scrape_once() == 0
