"""lifecycle.h as gcc lays it out == the Python mirrors in otel_ebpf/receivers/lifecycle/receiver.py;
decoding through them; the receiver config as it reaches the program."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.host.processes import ResourceCache
from otel_ebpf.receivers.lifecycle import Config, factory
from otel_ebpf.receivers.lifecycle import receiver as lifecycle_receiver
from otel_ebpf.receivers.lifecycle.events import LifecycleExec, LifecycleExitCode, LifecycleFork
from otel_ebpf.receivers.lifecycle.receiver import EXEC, EXIT_CODE, FORK, MIRRORS, LifecycleReceiver

from tests.support.layout import CLayout, assert_mirror, format_offsets, measure

DIR = Path(lifecycle_receiver.__file__).resolve().parent
ETYPES = {"lc_fork_rec": "LC_EV_FORK", "lc_exec_rec": "LC_EV_EXEC", "lc_exit_code_rec": "LC_EV_EXIT_CODE"}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> CLayout:
    return measure(DIR, "lifecycle.h", tmp_path_factory.mktemp("lifecycle_layout"),
                   structs={m.c_struct: m.fields for m in MIRRORS}, values=[*ETYPES.values(), "LC_ARGS_LEN"])


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_mirror_matches_c_layout(mirror: Mirror, c_layout: CLayout) -> None:
    assert_mirror(c_layout, mirror.c_struct, mirror.fmt, mirror.fields)


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_records_start_with_their_type_byte_in_the_lifecycle_range(mirror: Mirror, c_layout: CLayout) -> None:
    assert mirror.fields[0] == "type" and format_offsets(mirror.fmt)[0] == (0, 1)
    assert 48 <= mirror.etype == c_layout.values[ETYPES[mirror.c_struct]] <= 63


def test_python_constants_match_lifecycle_h(c_layout: CLayout) -> None:
    assert c_layout.values["LC_ARGS_LEN"] == lifecycle_receiver._ARGS_LEN


def _receiver(**cfg: object) -> LifecycleReceiver:
    return LifecycleReceiver(Config(**cfg), Context(), ListConsumer())  # type: ignore[arg-type]


def test_decode_each_record() -> None:
    r = _receiver()
    r.clock.to_epoch_ns = lambda ts: ts + 1000  # type: ignore[method-assign]
    assert r.decode(48, FORK.fmt.pack(48, 10, 9, 5, b"sh")) == LifecycleFork(10, 9, 1005, "sh")
    args = b"/bin/true\0a b\0"
    exe = EXEC.fmt.pack(49, 1, 2, 10, 11, len(args), 7, b"/bin/true", args)
    assert r.decode(49, exe) == LifecycleExec(10, 11, 1007, "/bin/true", ("/bin/true", "a b"), True)
    assert r.decode(50, EXIT_CODE.fmt.pack(50, 10, 3, 8)) == LifecycleExitCode(10, 1008, 3)
    with pytest.raises(ValueError):
        r.decode(51, bytes(64))


def test_decode_hands_fork_and_exec_to_the_resource_cache(tmp_path: Path) -> None:
    ctx = Context()
    ctx.resources = cache = ResourceCache(proc_root=str(tmp_path))  # nothing in /proc: every process is gone
    r = LifecycleReceiver(Config(), ctx, ListConsumer())
    r.decode(48, FORK.fmt.pack(48, 10, 9, 5, b"sh"))
    args = b"/bin/true\0--token\0t1\0"
    r.decode(49, EXEC.fmt.pack(49, 0, 3, 10, 10, len(args), 7, b"/bin/true", args))
    a = cache.get(10, "sh")
    assert a["process.parent_pid"] == 9 and a["process.executable.path"] == "/bin/true"
    assert a["process.command_line"] == "/bin/true --token <redacted>"
    assert cache.hints.get(10) is not None and cache.hints.get(10).exec_ns == 7  # type: ignore[union-attr]
    _receiver().decode(49, EXEC.fmt.pack(49, 0, 3, 10, 10, len(args), 7, b"/bin/true", args))  # no cache: fine


def test_config_reaches_the_program() -> None:
    flags = _receiver(max_pending_execs=7).program_cflags()
    assert "-DLC_EXEC_PENDING=7" in flags and "-DOE_LIFECYCLE_PAGES=128" in flags
    assert any(f.startswith("-DLC_NEWTASK_FLAGS_OFF=") for f in flags)
    assert any(f.startswith("-DLC_NEWTASK_PID_OFF=") for f in flags)


@pytest.mark.parametrize("key,value", [("ringbuf_pages", 3), ("max_pending_execs", 0), ("bogus", 1)])
def test_bad_config_names_its_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"receivers.lifecycle.{key}"):
        build(Config, {key: value}, "receivers.lifecycle")


def test_factory_is_on_by_default() -> None:
    assert factory.type == "lifecycle" and factory.config_class is Config and factory.default_on


def test_shutdown_without_start_and_twice_is_safe() -> None:
    r = _receiver()
    r.shutdown()
    r.shutdown()
    assert r.bpf is None
