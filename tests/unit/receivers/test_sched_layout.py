"""sched.h's constants as gcc sees them == the ones otel_ebpf/receivers/sched/receiver.py repeats; the
receiver config as it reaches the program; the keys that moved to the lifecycle receiver are refused."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.sched import Config, factory
from otel_ebpf.receivers.sched import receiver as sched_receiver
from otel_ebpf.receivers.sched.events import SchedProcStats
from otel_ebpf.receivers.sched.receiver import SchedReceiver, _proc_delta

from tests.support.layout import CLayout, measure

SCHED_DIR = Path(sched_receiver.__file__).resolve().parent


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> CLayout:
    return measure(SCHED_DIR, "sched.h", tmp_path_factory.mktemp("sched_layout"),
                   structs={}, values=["SCHED_HIST_SLOTS", "SCHED_R_RUNQ"])


def test_python_constants_match_sched_h(c_layout: CLayout) -> None:
    assert c_layout.values["SCHED_HIST_SLOTS"] == sched_receiver._HIST_SLOTS
    assert c_layout.values["SCHED_R_RUNQ"] == sched_receiver._R_RUNQ


def _receiver(**cfg) -> SchedReceiver:
    return SchedReceiver(Config(**cfg), Context(), ListConsumer())


def test_no_ring_buffer_records_are_decoded() -> None:
    """Fork, exec and exit code moved to the lifecycle receiver (its types 48..50): nothing here decodes them."""
    assert _receiver().decode(49, bytes(1560)) is None


def test_proc_deltas() -> None:
    first = (100, 1, 2, 3, 4, 50, 6, 7) + (0,) * 12 + (5,) + (0,) * 27
    ev = _proc_delta(3, 9, None, first)
    assert ev == SchedProcStats(3, 9, 100, (1, 2, 3, 4), 50, 6, 7, ((12, 5),))
    second = (150, *first[1:])
    assert _proc_delta(3, 10, first, second) == SchedProcStats(3, 10, 50, (0, 0, 0, 0), 0, 0, 0, ())
    assert _proc_delta(3, 11, second, second) is None


def test_config_reaches_the_program() -> None:
    flags = _receiver(max_threads=7, max_processes=8, max_cpu_keys=9, lock_reason=False).program_cflags()
    for flag in ("-DSCHED_MAX_THREADS=7", "-DSCHED_MAX_PROCS=8", "-DSCHED_MAX_CPU_KEYS=9", "-DSCHED_LOCK=0"):
        assert flag in flags
    assert any(f.startswith("-DSCHED_NEWTASK_FLAGS_OFF=") for f in flags)


@pytest.mark.parametrize("key,value", [("ringbuf_pages", 512), ("max_threads", 0), ("max_processes", 0),
                                       ("max_cpu_keys", 0), ("stats_interval", 0.001), ("sample_interval", 0)])
def test_bad_config_names_its_key(key: str, value: object) -> None:
    """ringbuf_pages (any value) moved to receivers.lifecycle: an unknown key now."""
    with pytest.raises(ConfigError, match=f"receivers.sched.{key}"):
        build(Config, {key: value}, "receivers.sched")


def test_factory() -> None:
    assert factory.type == "sched" and factory.config_class is Config


def test_shutdown_without_start_and_twice_is_safe() -> None:
    r = _receiver()
    r.shutdown()
    r.shutdown()
    assert r.bpf is None and r.read_stats() == []
