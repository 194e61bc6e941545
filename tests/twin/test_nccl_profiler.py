"""The twin's stand-in NCCL loads the profiler plugin NCCL_PROFILER_PLUGIN names and calls it as NCCL 2.28.9 does
(otel_ebpf/twin/nccl_profiler.c, nccl_prof_api.c, nccl_prof_plan.c, nccl_prof_proxy.c), under real torch with 2
ranks (tests/twin/programs/prof_ops.py), a recording plugin (tests/twin/prof_plugin.c) writing down every call:
init per communicator with NCCL's commHash, the API, launch, group, task and kernel-channel events in NCCL's order
with NCCL's parents and threads, seqNumber per function, kernel-channel times from when the twin's stream ran the
work, finalize at destroy; the activation mask as the plugin sets it, read again at every group API event."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv, launch
from tests.twin.conftest import PROGRAMS
from tests.twin.prof_log import Log, build_plugin, read_logs

NRANKS = 2
START_API_STOP, END_API_START, KERNEL_CH_STOP = 23, 24, 22  # ncclProfilerEventState_t
ALL, GROUP_API = 0xFFF, 0x100
# the main thread's calls of one collective call: src/enqueue.cc ncclEnqueueCheck, then src/group.cc doLaunches
ONE_COLL = ["+GroupApi", "@23", "+CollApi", "-CollApi", "@24", "+KernelLaunch", "-KernelLaunch", "+Group", "+Coll",
            "-Coll", "-Group", "-GroupApi"]
PARENTS = {"GroupApi": {None}, "Group": {None}, "CollApi": {"GroupApi"}, "P2pApi": {"GroupApi"},
           "KernelLaunch": {"GroupApi"}, "Coll": {"CollApi"}, "P2p": {"P2pApi"}, "KernelCh": {"Coll", "P2p"}}


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libnccl-profiler.so (NCCL's default name) and libnccl-profiler-rec4.so (v4 only), in one folder."""
    out = tmp_path_factory.mktemp("plugins")
    build_plugin(out / "libnccl-profiler.so")
    build_plugin(out / "libnccl-profiler-rec4.so", "-DPROF_V4")
    return out


def _run(twin: TwinEnv, twin_cache: Path, out: Path, env: dict[str, str]) -> list[Log]:
    out.mkdir(parents=True, exist_ok=True)
    run = launch(PROGRAMS / "prof_ops.py", NRANKS, [str(out)], env={"TEST_PROF_OUT": str(out), **env}, timeout=240,
                 twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    logs = read_logs(out, NRANKS)
    for log in logs:  # what moved is right: the program ran as without a plugin
        f = log.found
        assert f["late"] == [3.0, 3.0] and f["coalesced"] == [2.0, 2.0] and f["theirs"] == [float(1 - log.rank)]
        assert f["blocking"] == [42.0, 43.0] and f["a2a"] == [0.0, 0.0, 1.0, 1.0] and f["captured"] == [4.0]
    return logs


def _check_tree(log: Log) -> None:
    """Each event's parent is of the kind NCCL gives it, started before it on the same communicator; every event
    is stopped; every communicator's finalize comes after all its events."""
    finalized: dict[int, int] = {}
    for c in log.calls:
        if c["call"] == "finalize":
            assert c["ctx"] not in finalized, c
            finalized[c["ctx"]] = c["at"]
    assert set(finalized) == {i["ctx"] for i in log.inits}
    for e in log.starts.values():
        parent = log.starts.get(e["parent"])
        assert (parent["kind"] if parent else None) in PARENTS[e["kind"]], (e, parent)
        assert parent is None or (parent["at"] < e["at"] and parent["ctx"] == e["ctx"]), (e, parent)
        if e["kind"] in ("Coll", "P2p"):
            assert log.kind_of(e["group"]) == "Group", e
        assert len(log.stops.get(e["id"], [])) == 1, e
        assert all(x["at"] < finalized[e["ctx"]] for x in [e, *log.stops[e["id"]], *log.records.get(e["id"], [])])


def _check_kernel_channels(log: Log, task: dict[str, object], step: str) -> list[tuple[int, int]]:
    """The task's nChannels KernelCh events, one per channel, on a proxy thread: start, ncclProfilerKernelChStop
    with the end time, stop; both times inside the step's host window. Returns (start, end) per channel."""
    chans = log.children(int(task["id"]), "KernelCh")  # type: ignore[call-overload]
    assert sorted(c["channel"] for c in chans) == list(range(len(chans))) or task["kind"] == "P2p", chans
    assert len(chans) == task["nch"], (task, chans)
    lo, hi = log.steps[step]
    times = []
    for c in chans:
        (rec,) = log.records[c["id"]]
        assert rec["state"] == KERNEL_CH_STOP and rec["at"] < log.stops[c["id"]][0]["at"]
        assert lo <= c["ptimer"] <= rec["ptimer"] <= hi, (step, c, rec)
        assert c["tid"] not in (log.pid, task["tid"]), c  # the comm's proxy thread, not the caller's nor the stream's
        times.append((c["ptimer"], rec["ptimer"]))
    return times


def _check_inits(logs: list[Log]) -> None:
    """init per comm, world then new_group's split, with the same commHash on both ranks, on the calling thread."""
    world, sub = zip(*(log.inits for log in logs), strict=True)
    for comm in (world, sub):
        assert [i["rank"] for i in comm] == [0, 1] and {i["nranks"] for i in comm} == {2}
        assert len({i["hash"] for i in comm}) == 1 and {i["nnodes"] for i in comm} == {1}
        assert {(i["version"], i["tid"]) for i in comm} == {(5, log.pid) for log in logs}  # blocking: the caller
    assert world[0]["hash"] != sub[0]["hash"]
    for log in logs:
        assert len({i["mask_ptr"] for i in log.inits}) == 1  # one ncclProfilerEventMask for every comm


def _check_order(log: Log) -> None:
    """The main thread's calls per step, in NCCL's order."""
    for step in ("late_all_reduce", "big_all_reduce", "reduce_scatter", "all_gather", "broadcast", "sub_all_reduce"):
        assert log.sequence(step) == ONE_COLL, (step, log.sequence(step))
    # two all_reduces in one group, the large one called first: ncclPrepareTasks puts one (fn, op, type) in
    # size-ascending order, so the small one is planned, numbered and launched first
    coll_pair = ["+Coll", "+Coll", "-Coll", "-Coll"]
    assert log.sequence("coalesced") == ONE_COLL[:4] + ONE_COLL[2:8] + coll_pair + ONE_COLL[10:]
    apis, colls = log.in_step("coalesced", "CollApi"), log.in_step("coalesced", "Coll")
    assert [a["count"] for a in apis] == [65536, 16]
    assert [c["parent"] for c in colls] == [apis[1]["id"], apis[0]["id"]] and [c["seq"] for c in colls] == [2, 3]
    # torch wraps each send/recv of a batch in its own ncclGroupStart/End (AutoNcclGroup): those ends count
    # profilerGroupDepth down to 0, so NCCL 2.28.9 stops the GroupApi event before the group launches
    assert log.sequence("batch_p2p") == ["+GroupApi", "@23", "+P2pApi", "-P2pApi", "+P2pApi", "-P2pApi", "@24",
                                         "-GroupApi", "+KernelLaunch", "-KernelLaunch", "+Group", "+P2p", "+P2p",
                                         "-P2p", "-P2p", "-Group"]
    assert [p["func"] for p in log.in_step("batch_p2p", "P2p")] == ["Send", "Recv"]
    # ncclAlltoAll: a send and a recv per peer (taskAppend), planned round by round of the p2p schedule
    a2a = [(p["func"], p["peer"]) for p in log.in_step("all_to_all", "P2p")]
    assert a2a == [("Send", log.rank), ("Recv", log.rank), ("Send", 1 - log.rank), ("Recv", 1 - log.rank)]
    captured = log.in_step("capture", "GroupApi") + log.in_step("capture", "CollApi")
    assert [a["captured"] for a in captured] == [1, 1]
    assert log.sequence("capture") == [*ONE_COLL[:7], "-GroupApi"]  # captured: the plan's events wait for replays
    for replay in ("replay1", "replay2"):  # a captured plan with proxy ops: hostStreamPlanTask at each replay
        (coll,) = log.in_step(replay, "Coll")
        assert coll["tid"] != log.pid
        assert log.sequence(replay, coll["tid"]) == ["+Group", "+Coll", "-Coll", "-Group"]


def _check_descriptors(log: Log) -> None:
    """What NCCL puts in a Coll event: its task's count and type (bytes of ncclInt8 for AllGather and Broadcast),
    the twin's algorithm, protocol and channels; API events carry rank 0, Coll and P2p the comm's rank."""
    seen = [log.in_step(s, "Coll")[0] for s in ("late_all_reduce", "big_all_reduce", "all_gather", "broadcast")]
    assert [(d["func"], d["count"], d["datatype"], d["algo"], d["proto"], d["nch"]) for d in seen] == [
        ("AllReduce", 1024, "ncclFloat32", "RING", "LL", 1), ("AllReduce", 1 << 20, "ncclFloat32", "RING", "SIMPLE", 2),
        ("AllGather", 4096, "ncclInt8", "RING", "LL", 2), ("Broadcast", 16, "ncclInt8", "RING", "LL", 1)]
    assert log.in_step("all_gather", "CollApi")[0]["datatype"] == "ncclFloat32"  # the API event keeps the call's
    assert all(e["rank"] == (log.rank if e["kind"] in ("Coll", "P2p") else 0) for e in log.starts.values())


def test_every_call_as_nccl_makes_it(twin: TwinEnv, twin_cache: Path, tmp_path: Path, plugins: Path) -> None:
    # NCCL_PROFILER_PLUGIN empty: NCCL's default name, libnccl-profiler.so, found on the library path
    logs = _run(twin, twin_cache, tmp_path, {"NCCL_PROFILER_PLUGIN": "", "LD_LIBRARY_PATH": str(plugins)})
    _check_inits(logs)
    for log in logs:
        _check_tree(log)
        _check_order(log)
        _check_descriptors(log)
    _check_sequences_and_times(logs)


def _check_sequences_and_times(logs: list[Log]) -> None:
    """seqNumber counts each comm's collectives per function from 0, captured ones at each replay, the same on both
    ranks; every Coll and P2p has its kernel channels, timed by the stream engine."""
    per_rank = []
    for log in logs:
        ctx_index = {i["ctx"]: n for n, i in enumerate(log.inits)}
        colls = [(ctx_index[c["ctx"]], c["func"], c["seq"], c["count"]) for c in log.of("Coll")]
        per_rank.append(colls)
        for key in {(k, f) for k, f, _, _ in colls}:
            assert [s for k, f, s, _ in colls if (k, f) == key] == list(range(sum(1 for k, f, _, _ in colls
                                                                                  if (k, f) == key))), colls
        proxies: dict[int, set[int]] = {}
        step_of = {c["id"]: s for s in log.steps for k in ("Coll", "P2p") for c in log.in_step(s, k)}
        for task in log.of("Coll") + log.of("P2p"):
            _check_kernel_channels(log, task, step_of[task["id"]])
            proxies.setdefault(task["ctx"], set()).update(c["tid"] for c in log.children(task["id"], "KernelCh"))
        assert all(len(t) == 1 for t in proxies.values()) and len(set.union(*proxies.values())) == len(proxies)
    assert per_rank[0] == per_rank[1]
    late = [_check_kernel_channels(log, log.in_step("late_all_reduce", "Coll")[0], "late_all_reduce")[0]
            for log in logs]
    assert late[0][1] - late[0][0] > 200_000_000  # rank 0's stream waited for rank 1, 0.3 s late
    assert max(s for s, _ in late) <= min(e for _, e in late)  # neither rank's all_reduce ended before both began


def test_group_api_only_mask_gets_only_group_api_events(twin: TwinEnv, twin_cache: Path, tmp_path: Path,
                                                        plugins: Path) -> None:
    logs = _run(twin, twin_cache, tmp_path, {"NCCL_PROFILER_PLUGIN": str(plugins / "libnccl-profiler.so"),
                                             "TEST_PROF_MASK": str(GROUP_API)})
    for log in logs:
        assert {c["kind"] for c in log.starts.values()} == {"GroupApi"}
        assert {r["state"] for rs in log.records.values() for r in rs} == {START_API_STOP, END_API_START}
        assert Counter(c["call"] for c in log.calls) == Counter(
            init=2, finalize=2, start=len(log.starts), stop=len(log.starts), record=2 * len(log.starts))
        assert len(log.starts) == 11  # one per step that calls NCCL (all but the replays)


def test_mask_read_again_at_each_group_api_event(twin: TwinEnv, twin_cache: Path, tmp_path: Path,
                                                 plugins: Path) -> None:
    """All events; at the 1st GroupApi event the plugin narrows the mask to GroupApi, at the 4th it widens it again:
    the big all_reduce, reduce_scatter and all_gather make only GroupApi events, and each stops the late
    all_reduce's CollApi handle once more (NCCL 2.28.9 ncclProfilerStopCollApiEvent does not clear it); the
    coalesced all_reduces are numbered 2 and 3, the hidden big one having counted. The plugin also gives NCCL a
    NULL handle for every Coll event: NCCL never stops one, and its kernel channels have no parent."""
    logs = _run(twin, twin_cache, tmp_path, {"NCCL_PROFILER_PLUGIN": str(plugins / "libnccl-profiler.so"),
                                             "TEST_PROF_MASK_AFTER": f"1:{GROUP_API},4:{ALL}", "TEST_PROF_NULL": "2"})
    no_coll_stop = [*ONE_COLL[:9], "-Group", "-GroupApi"]  # NCCL stops no NULL handle
    for log in logs:
        assert log.sequence("late_all_reduce") == no_coll_stop
        (late_api,) = log.in_step("late_all_reduce", "CollApi")
        for step in ("big_all_reduce", "reduce_scatter", "all_gather"):
            assert log.sequence(step) == ["+GroupApi", "@23", "-CollApi", "@24", "-GroupApi"], step
        assert len(log.stops[late_api["id"]]) == 4
        assert [c["seq"] for c in log.in_step("coalesced", "Coll")] == [2, 3]
        assert log.sequence("broadcast") == no_coll_stop
        assert not any(c["id"] in log.stops for c in log.of("Coll"))
        orphans = [k for k in log.of("KernelCh") if k["parent"] == 0]
        assert len(orphans) == sum(c["nch"] for c in log.of("Coll")) > 0 and all(k["id"] in log.stops for k in orphans)


def test_v4_plugin_by_name_and_none(twin: TwinEnv, twin_cache: Path, tmp_path: Path, plugins: Path) -> None:
    """A bare name is opened as libnccl-profiler-<name>.so; a plugin with only ncclProfiler_v4 gets v4's calls
    (src/plugin/profiler/profiler_v4.cc): no API or launch events, no group API states, a Coll's parent its Group.
    "none" loads nothing, even with libnccl-profiler.so on the library path."""
    logs = _run(twin, twin_cache, tmp_path / "v4", {"NCCL_PROFILER_PLUGIN": "rec4", "LD_LIBRARY_PATH": str(plugins)})
    for log in logs:
        assert {i["version"] for i in log.inits} == {4} and len(log.inits) == 2
        assert {c["kind"] for c in log.starts.values()} == {"Group", "Coll", "P2p", "KernelCh"}
        assert {r["state"] for rs in log.records.values() for r in rs} == {KERNEL_CH_STOP}
        assert all(log.kind_of(c["parent"]) == "Group" for c in log.of("Coll") + log.of("P2p"))
        assert len(log.of("Coll")) == len(logs[0].of("Coll")) > 0
    none = tmp_path / "none"
    logs = _run(twin, twin_cache, none, {"NCCL_PROFILER_PLUGIN": "NONE", "LD_LIBRARY_PATH": str(plugins)})
    assert not list(none.glob("prof-*.jsonl")) and all(not log.calls for log in logs)
