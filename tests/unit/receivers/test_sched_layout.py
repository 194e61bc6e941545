"""sched.h as gcc lays it out == the Python mirrors in otel_ebpf/receivers/sched/receiver.py; decoding
through them; the receiver config as it reaches the program."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.sched import Config, factory
from otel_ebpf.receivers.sched import receiver as sched_receiver
from otel_ebpf.receivers.sched.events import SchedExec, SchedExitCode, SchedFork, SchedProcStats
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.receivers.sched.receiver import EXEC, EXIT_CODE, FORK, MIRRORS, SchedReceiver, _proc_delta

from tests.support.layout import CLayout, assert_mirror, format_offsets, measure

SCHED_DIR = Path(sched_receiver.__file__).resolve().parent
ETYPES = {"sched_fork_rec": "SCHED_EV_FORK", "sched_exec_rec": "SCHED_EV_EXEC",
          "sched_exit_code_rec": "SCHED_EV_EXIT_CODE"}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> CLayout:
    return measure(SCHED_DIR, "sched.h", tmp_path_factory.mktemp("sched_layout"),
                   structs={m.c_struct: m.fields for m in MIRRORS},
                   values=[*ETYPES.values(), "SCHED_HIST_SLOTS", "SCHED_ARGS_LEN", "SCHED_R_RUNQ"])


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_mirror_matches_c_layout(mirror: Mirror, c_layout: CLayout) -> None:
    assert_mirror(c_layout, mirror.c_struct, mirror.fmt, mirror.fields)


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_records_start_with_their_type_byte_in_the_sched_range(mirror: Mirror, c_layout: CLayout) -> None:
    assert mirror.fields[0] == "type" and format_offsets(mirror.fmt)[0] == (0, 1)
    assert 48 <= mirror.etype == c_layout.values[ETYPES[mirror.c_struct]] <= 63


def test_python_constants_match_sched_h(c_layout: CLayout) -> None:
    assert c_layout.values["SCHED_HIST_SLOTS"] == sched_receiver._HIST_SLOTS
    assert c_layout.values["SCHED_ARGS_LEN"] == sched_receiver._ARGS_LEN
    assert c_layout.values["SCHED_R_RUNQ"] == sched_receiver._R_RUNQ


def _receiver(**cfg) -> SchedReceiver:
    return SchedReceiver(Config(**cfg), Context(), ListConsumer())


def test_decode_each_record() -> None:
    r = _receiver()
    r.clock.to_epoch_ns = lambda ts: ts + 1000  # type: ignore[method-assign]
    fork = FORK.fmt.pack(48, 10, 9, 5, b"sh")
    assert r.decode(48, fork) == SchedFork(10, 9, 1005, "sh")
    args = b"/bin/true\0a b\0"
    exe = EXEC.fmt.pack(49, 1, 2, 10, 11, len(args), 7, b"/bin/true", args)
    assert r.decode(49, exe) == SchedExec(10, 11, 1007, "/bin/true", ("/bin/true", "a b"), True)
    assert r.decode(50, EXIT_CODE.fmt.pack(50, 10, 3, 8)) == SchedExitCode(10, 1008, 3)
    with pytest.raises(ValueError):
        r.decode(51, bytes(64))


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


@pytest.mark.parametrize("key,value", [("ringbuf_pages", 3), ("max_threads", 0), ("max_processes", 0),
                                       ("max_cpu_keys", 0), ("stats_interval", 0.001), ("sample_interval", 0)])
def test_bad_config_names_its_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"receivers.sched.{key}"):
        build(Config, {key: value}, "receivers.sched")


def test_factory() -> None:
    assert factory.type == "sched" and factory.config_class is Config


def test_shutdown_without_start_and_twice_is_safe() -> None:
    r = _receiver()
    r.shutdown()
    r.shutdown()
    assert r.bpf is None and r.read_stats() == []
