"""libnccl-profiler-otel_ebpf driven as NCCL 2.28.9 (v5) and 2.29+ (v6) drive it (driver.c, nccl_sim.c), without
an agent: what it ships, what NCCL is asked for, and chaining to a user's plugin (counting_plugin.c), which must
receive exactly the calls NCCL itself would have made to it. The probes with an agent attached: test_probes_bpf.py."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf import nccl_profiler
from tests.nccl_profiler.conftest import COUNTING, NARROW

SCRIPT = ["init 0x1234abcd 0 2 world", "single 0", "group2 0", "p2p 0", "init 0x5678 1 4 sub", "single 1",
          "group2 1", "finalize 1", "finalize 0"]
# NCCL 2.28.9 include/plugin/nccl_profiler.h bits
GROUP, COLL, P2P, PROXY_OP, PROXY_CTRL, KERNEL_CH, NET_PLUGIN, GROUP_API, COLL_API, P2P_API, KERNEL_LAUNCH = (
    0x1, 0x2, 0x4, 0x8, 0x20, 0x40, 0x80, 0x100, 0x200, 0x400, 0x800)


def run_script(run_driver: Any, plugin: Path | None, version: int, env: dict[str, str]) -> tuple[list[int], str]:
    d = run_driver(plugin, version, env)
    masks = [d.run(c)[0] for c in SCRIPT]
    return masks, d.close()


def test_the_built_plugin_exports_v5_and_v6_needs_only_libc_and_has_every_probe(plugin: Path) -> None:
    assert plugin == nccl_profiler.plugin_path() and plugin.name == "libnccl-profiler-otel_ebpf.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert {"ncclProfiler_v5", "ncclProfiler_v6"} <= set(syms) and "ncclProfiler_v4" not in syms
    exported = [s for s in syms if re.fullmatch(r"[A-Za-z_]\w*", s) and s not in ("D", "T", "B", "R", "W")]
    assert sorted(exported) == ["ncclProfiler_v5", "ncclProfiler_v6"], exported  # -fvisibility=hidden
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", subprocess.run(["readelf", "-d", str(plugin)], capture_output=True,
                                                                 text=True, check=True).stdout)
    assert set(needed) <= {"libc.so.6", "libdl.so.2"}, needed
    notes = subprocess.run(["readelf", "-n", str(plugin)], capture_output=True, text=True, check=True).stdout
    probes = set(re.findall(r"Provider: otel_ebpf_nccl\s+Name: (\w+)", notes))
    assert probes == set(nccl_profiler.PROBES), probes
    assert "Semaphore: 0x0000000000000000" not in notes  # every probe has its semaphore


@pytest.mark.parametrize("version", [5, 6])
def test_without_an_agent_nccl_is_asked_for_group_api_events_only_and_gets_null_handles(
        run_driver: Any, plugin: Path, version: int) -> None:
    d = run_driver(plugin, version)
    for command in SCRIPT:
        mask, calls = d.run(command)
        assert mask == NARROW, (command, mask)
        # one GroupApi start per group (NCCL's outermost group only), a NULL handle, nothing recorded or stopped
        expected = {"single": 1, "group2": 1, "p2p": 1}.get(command.split()[0], 0)
        assert [(c["ev"], c.get("type"), c.get("h")) for c in calls if c["ev"] not in ("init", "finalize")] == \
            [("start", GROUP_API, 0)] * expected, (command, calls)
    assert "NCCLLOG 2" not in d.close()  # no warning


@pytest.mark.parametrize("version", [5, 6])
@pytest.mark.parametrize("mask", [COLL | KERNEL_CH | COLL_API | PROXY_CTRL, GROUP, P2P, KERNEL_CH, GROUP_API,
                                  COLL_API | P2P_API | KERNEL_LAUNCH, 0xFFF, PROXY_CTRL, PROXY_OP, NET_PLUGIN])
def test_a_chained_plugin_gets_exactly_the_calls_nccl_would_make_to_it(
        run_driver: Any, plugin: Path, counting_dir: Path, tmp_path: Path, version: int, mask: int) -> None:
    alone, chained = tmp_path / "alone.log", tmp_path / "chained.log"
    alone_masks, _ = run_script(run_driver, counting_dir / COUNTING, version,
                                {"COUNTING_LOG": str(alone), "COUNTING_MASK": hex(mask)})
    masks, log = run_script(run_driver, plugin, version,
                            {"COUNTING_LOG": str(chained), "COUNTING_MASK": hex(mask),
                             "OTEL_EBPF_NCCL_PROFILER_CHAIN": "counting", "LD_LIBRARY_PATH": str(counting_dir)})
    lines = chained.read_text().splitlines()
    # same calls, same order, same parents/contexts (by the counting plugin's own serials): as if NCCL called it
    assert lines == alone.read_text().splitlines()
    assert "?" not in chained.read_text() and "again" not in chained.read_text()  # only its own handles
    assert alone_masks == [mask] * len(SCRIPT)
    assert masks == [NARROW | mask] * len(SCRIPT)  # ours (no agent) united with its own
    assert f"chained profiler plugin counting (ncclProfiler_v5) from {COUNTING}" in log
    assert len(lines) > 4 or mask == PROXY_CTRL  # init, finalize x2: NCCL's proxy makes no ProxyCtrl here
    if mask & KERNEL_CH:  # kernel channels: from the proxy thread, parents NCCL had stopped already
        kch = [ln for ln in lines if " type=64 " in ln]
        assert len(kch) == 16 and all(" parent=0 " not in ln for ln in kch), kch


@pytest.mark.parametrize("spec", ["counting", COUNTING, "{dir}/" + COUNTING])
def test_chain_names_resolve_as_nccl_resolves_nccl_profiler_plugin(
        run_driver: Any, plugin: Path, counting_dir: Path, tmp_path: Path, spec: str) -> None:
    log = tmp_path / "c.log"
    env = {"OTEL_EBPF_NCCL_PROFILER_CHAIN": spec.format(dir=counting_dir), "COUNTING_LOG": str(log),
           "LD_LIBRARY_PATH": str(counting_dir)}
    masks, stderr = run_script(run_driver, plugin, 5, env)
    assert "chained profiler plugin counting" in stderr and masks[-1] == NARROW | 0x2 | 0x40 | 0x200 | 0x20
    assert log.read_text().startswith("init ctx=1 commId=0x1234abcd rank=0 nranks=2 name=world logger=1\n")


@pytest.mark.parametrize("spec, message", [
    ("missing", "OTEL_EBPF_NCCL_PROFILER_CHAIN=missing: not loaded"),
    ("NONE", None),
    ("{plugin}", "names otel_ebpf itself"),
    ("otel_ebpf", "names otel_ebpf itself"),  # -> libnccl-profiler-otel_ebpf.so on the loader path
    ("libc.so.6", "has no ncclProfiler_v6 or ncclProfiler_v5"),
])
def test_an_unusable_chain_is_said_once_and_the_plugin_runs_alone(
        run_driver: Any, plugin: Path, spec: str, message: str | None) -> None:
    env = {"OTEL_EBPF_NCCL_PROFILER_CHAIN": spec.format(plugin=plugin), "LD_LIBRARY_PATH": str(plugin.parent)}
    masks, stderr = run_script(run_driver, plugin, 5, env)
    assert masks == [NARROW] * len(SCRIPT)
    if message is None:
        assert "NCCLLOG" not in stderr, stderr
    else:
        assert stderr.count(message) == 1, stderr
        assert "chained profiler plugin" not in stderr


@pytest.mark.parametrize("fail", ["start", "init"])
def test_a_failing_chained_plugin_never_breaks_nccl(run_driver: Any, plugin: Path, counting_dir: Path,
                                                    tmp_path: Path, fail: str) -> None:
    log = tmp_path / "c.log"
    env = {"OTEL_EBPF_NCCL_PROFILER_CHAIN": str(counting_dir / COUNTING), "COUNTING_LOG": str(log),
           "COUNTING_FAIL": fail, "COUNTING_MASK": hex(COLL | KERNEL_CH)}
    masks, stderr = run_script(run_driver, plugin, 6, env)
    warnings = [ln for ln in stderr.splitlines() if ln.startswith("NCCLLOG 2 ")]
    lines = log.read_text().splitlines()
    if fail == "start":  # its events still reach it (NCCL ignores startEvent's result too); said once
        assert warnings == ["NCCLLOG 2 PROFILER/otel_ebpf: chained profiler plugin: startEvent returned 3 "
                            "(said once; forwarding goes on)"]
        assert sum(ln.startswith("start ") for ln in lines) > 10 and masks[1] == NARROW | COLL | KERNEL_CH
    else:  # no context, so nothing is forwarded; its mask write never happened
        assert warnings == ["NCCLLOG 2 PROFILER/otel_ebpf: chained profiler plugin: init returned 3 "
                            "(said once; forwarding goes on)"]
        assert lines == ["init failed", "init failed"] and masks == [NARROW] * len(SCRIPT)


@pytest.mark.parametrize("chained", [False, True])
def test_a_mask_set_from_outside_the_plugin_is_kept(run_driver: Any, plugin: Path, counting_dir: Path,
                                                     tmp_path: Path, chained: bool) -> None:
    """NCCL 2.32's RAS override stores NCCL's mask job-wide; the plugin adds its bits to it, never drops it."""
    env = {"OTEL_EBPF_NCCL_PROFILER_CHAIN": str(counting_dir / COUNTING), "COUNTING_MASK": hex(COLL),
           "COUNTING_LOG": str(tmp_path / "c.log")} if chained else {}
    d = run_driver(plugin, 6, env)
    assert d.run("init 0x1234abcd 0 2 world")[0] == NARROW | (COLL if chained else 0)
    assert d.run(f"ras {PROXY_OP:#x}")[0] == PROXY_OP
    mask, calls = d.run("group2 0")
    # without an agent or chain the mask is not touched at all; with a chain it is the union, the override kept
    assert mask == (PROXY_OP | NARROW | COLL if chained else PROXY_OP)
    assert calls and all(c["h"] == 0 for c in calls if not chained)  # NCCL asks, no agent: NULL handles
    assert d.run("single 0")[0] == mask


def test_launch_env_names_the_plugin_and_moves_a_users_plugin_to_the_chain(plugin: Path) -> None:
    env = nccl_profiler.launch_env
    assert env({}) == {"NCCL_PROFILER_PLUGIN": str(plugin)}
    assert env({"NCCL_PROFILER_PLUGIN": "inspector"}) == {"NCCL_PROFILER_PLUGIN": str(plugin),
                                                         "OTEL_EBPF_NCCL_PROFILER_CHAIN": "inspector"}
    for ours_or_none in ("none", "NONE", "otel_ebpf", str(plugin), ""):
        assert env({"NCCL_PROFILER_PLUGIN": ours_or_none}) == {"NCCL_PROFILER_PLUGIN": str(plugin)}
    # a chain the user set already wins
    assert env({"NCCL_PROFILER_PLUGIN": "a", "OTEL_EBPF_NCCL_PROFILER_CHAIN": "b"}) == \
        {"NCCL_PROFILER_PLUGIN": str(plugin)}
    assert env({}, plugin=Path("/x/y.so")) == {"NCCL_PROFILER_PLUGIN": "/x/y.so"}


def test_require_plugin_says_how_to_build_it_when_it_is_missing(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    from otel_ebpf.core.errors import EnvironmentError_

    monkeypatch.setattr(nccl_profiler, "_HERE", tmp_path)
    assert nccl_profiler.plugin_path() is None
    with pytest.raises(EnvironmentError_, match=r"libnccl-profiler-otel_ebpf\.so is not built") as e:
        nccl_profiler.require_plugin()
    assert e.value.hint is not None and "systemtap-sdt-dev" in e.value.hint
