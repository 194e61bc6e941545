"""The plugin's USDT probes with an agent attached: BCC (USDT(pid=...), enable_probe) on the driver (driver.c, the
NCCL 2.28.9 model) running the built plugin. Every record must carry what NCCL passed (compared with the driver's
trace of the same calls), the kernel-channel probes fire on the proxy thread, NCCL's mask widens at the first group
after the attach and narrows after the detach, and communicators initialized before the attach are announced."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.nccl_profiler import PROBES
from tests.nccl_profiler.conftest import ABI_DIR, NARROW, WIDE

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
NAMES = dict(enumerate(["", "comm_init", "comm_finalize", "group_start", "api_start", "coll_start", "p2p_start",
                        "kernel_ch_start", "kernel_ch_stop", "event_stop"]))
GROUP, COLL, P2P, KERNEL_CH, GROUP_API, COLL_API, P2P_API = 0x1, 0x2, 0x4, 0x40, 0x100, 0x200, 0x400
# collect.bpf.c's f[] then s0..s3, per record (probes.h field names)
STRINGS = {"comm_init": (), "coll_start": ("func", "datatype", "algo", "proto"), "p2p_start": ("func", "datatype")}
FIELDS = {"comm_init": ("comm_hash", "rank", "nranks", "nnodes", "version"),
          "coll_start": ("context", "parent", "seq", "count", "send_buff", "recv_buff", "root", "nchannels", "nwarps",
                         "api", *STRINGS["coll_start"]),
          "p2p_start": ("context", "parent", "count", "buff", "peer", "nchannels", "api", *STRINGS["p2p_start"])}


class Collector:
    """collect.bpf.c attached to every probe of process ``pid``; :meth:`take` returns the hits since the last."""

    def __init__(self, pid: int) -> None:
        from bcc import BPF, USDT

        self.usdt = USDT(pid=pid)
        for probe in PROBES:
            self.usdt.enable_probe(probe=probe, fn_name=f"on_{probe}")
        self.bpf = BPF(src_file=str(HERE / "collect.bpf.c"), cflags=[f"-I{ABI_DIR}"], usdt_contexts=[self.usdt])
        self.got: list[dict[str, Any]] = []
        self.bpf["events"].open_perf_buffer(self._on, page_cnt=64)

    def _on(self, cpu: int, data: Any, size: int) -> None:
        e = self.bpf["events"].event(data)
        name = NAMES[e.probe]
        ev: dict[str, Any] = {"probe": name, "tid": e.tid, "a": e.a, "b": e.b, "c": e.c, "d": e.d}
        fields = FIELDS.get(name, ())
        if fields:
            strings = [e.s0.decode(), e.s1.decode(), e.s2.decode(), e.s3.decode()]
            ev["rec"] = dict(zip(fields, [*list(e.f)[:len(fields) - len(STRINGS[name])], *strings[:len(STRINGS[name])]],
                                 strict=True))
            if name == "comm_init":
                ev["rec"]["name"] = e.name.decode()
        self.got.append(ev)

    def take(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        hits = self.bpf["hits"]
        deadline = time.monotonic() + timeout
        while len(self.got) < sum(v.value for v in hits.values()):
            assert time.monotonic() < deadline, f"{len(self.got)} of {hits[0].value} probe hits arrived"
            self.bpf.perf_buffer_poll(timeout=50)
        hits.clear()
        got, self.got = self.got, []
        return got

    def close(self) -> None:
        self.bpf.cleanup()  # detaches: the kernel drops the uprobes
        del self.bpf
        del self.usdt  # bcc_usdt_close: lowers the semaphores BCC raised through /proc/PID/mem


def expected(calls: list[dict[str, Any]], ctx_ids: dict[int, int]) -> list[tuple[Any, ...]]:
    """The probe hits the plugin owes for the driver's trace of one command (see probes.h)."""
    out: list[tuple[Any, ...]] = []
    started: dict[int, int] = {}
    for c in calls:
        if c["ev"] == "start" and c["h"]:
            h, t, ctx = c["h"], c["type"], ctx_ids[c["ctx"]]
            started[h] = t
            if t == GROUP:
                out.append(("group_start", h, ctx))
            elif t in (COLL_API, P2P_API):
                out.append(("api_start", h, t))
            elif t == COLL:
                out.append(("coll_start", h, ctx, c["group"], c["seq"], c["count"], c["send"], c["recv"], c["parent"]))
            elif t == P2P:
                out.append(("p2p_start", h, ctx, c["group"], c["count"], c["buff"], c["peer"], c["func"], c["parent"]))
            elif t == KERNEL_CH:
                out.append(("kernel_ch_start", h, c["parent"], c["channel"], c["ptimer"]))
        elif c["ev"] == "record" and c["state"] == 22 and c["h"] in started:
            out.append(("kernel_ch_stop", c["h"], c["ptimer"]))
        elif c["ev"] == "stop" and c["h"] in started:
            out.append(("event_stop", c["h"], started[c["h"]]))
    return sorted(out)


def observed(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        p, r = e["probe"], e.get("rec", {})
        if p == "coll_start":
            out.append((p, e["a"], r["context"], r["parent"], r["seq"], r["count"], r["send_buff"], r["recv_buff"],
                        r["api"]))
            assert (r["func"], r["datatype"], r["algo"], r["proto"], r["nchannels"], r["nwarps"], r["root"]) == \
                ("AllReduce", "ncclFloat32", "RING", "SIMPLE", 2, 16, 0), r
        elif p == "p2p_start":
            out.append((p, e["a"], r["context"], r["parent"], r["count"], r["buff"], r["peer"], r["func"], r["api"]))
            assert (r["datatype"], r["nchannels"]) == ("ncclFloat32", 2), r
        elif p in ("group_start", "api_start", "kernel_ch_stop", "event_stop"):
            out.append((p, e["a"], e["b"]))
        elif p == "kernel_ch_start":
            out.append((p, e["a"], e["b"], e["c"], e["d"]))
        else:
            raise AssertionError(f"unexpected {e}")
    return sorted(out)


def comm_inits(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["a"]: e["rec"] for e in events if e["probe"] == "comm_init"}


@pytest.mark.parametrize("version", [5, 6])
def test_records_carry_what_nccl_passed_and_the_mask_follows_the_agent(
        bpf_ready: None, run_driver: Any, plugin: Path, version: int) -> None:
    d = run_driver(plugin, version)
    inits = {}
    mask, calls = d.run("init 0x1234abcd 0 2 world")
    inits[0x1234abcd] = calls[0]["ctx"]
    assert mask == NARROW
    col = Collector(d.pid)
    try:
        # the first group after the attach: NCCL loaded the narrow mask for it, the plugin widens it and announces
        # the communicator NCCL initialized before the attach; nothing else of that group is recorded
        mask, calls = d.run("single 0")
        assert mask == WIDE and [(c["type"], c["h"]) for c in calls] == [(GROUP_API, 0)]
        got = col.take()
        comms = comm_inits(got)
        assert [e["probe"] for e in got] == ["comm_init"] and list(comms.values()) == [
            {"comm_hash": 0x1234abcd, "rank": 0, "nranks": 2, "nnodes": 1, "version": 1, "name": "world"}]
        ctx_ids = {inits[0x1234abcd]: next(iter(comms))}
        assert ctx_ids[inits[0x1234abcd]] != 0

        for command, n_kernel_ch in (("group2 0", 4), ("p2p 0", 4), ("single 0", 2)):
            mask, calls = d.run(command)
            got = col.take()
            assert mask == WIDE and observed(got) == expected(calls, ctx_ids), command
            # kernel channels start, stop and end on NCCL's proxy thread, the rest on the application's
            proxy = [e for e in got if e["probe"].startswith("kernel_ch") or
                     (e["probe"] == "event_stop" and e["b"] == KERNEL_CH)]
            assert len(proxy) == 3 * n_kernel_ch and d.pid not in {e["tid"] for e in proxy}, command
            assert {e["tid"] for e in got if e not in proxy} == {d.pid}
            if command == "group2 0":  # seqNumber counts every AllReduce, the unrecorded first one included
                colls = sorted((e["rec"]["seq"], e["rec"]["count"]) for e in got if e["probe"] == "coll_start")
                assert colls == [(1, 1024), (2, 2048)]

        # a communicator made while attached is announced at init; its destroy is seen
        mask, calls = d.run("init 0x5678 1 4 second")
        comms, ctx1 = comm_inits(col.take()), calls[0]["ctx"]
        assert [r["comm_hash"] for r in comms.values()] == [0x5678] and set(comms).isdisjoint(ctx_ids.values())
        ctx_ids[ctx1] = next(iter(comms))
        mask, calls = d.run("single 1")
        assert observed(col.take()) == expected(calls, ctx_ids) != []
        d.run("finalize 1")
        assert [(e["probe"], e["a"]) for e in col.take()] == [("comm_finalize", ctx_ids[ctx1])]
    finally:
        col.close()
    # detached: the next group API event narrows the mask; NCCL still made that group's calls (it had loaded the
    # wide mask), which got NULL handles; the one after is a single GroupApi call again
    mask, calls = d.run("single 0")
    assert mask == NARROW and all(c["h"] == 0 for c in calls)
    mask, calls = d.run("single 0")
    assert mask == NARROW and [(c["type"], c["h"]) for c in calls] == [(GROUP_API, 0)]
    # attached again: the live communicator (not the destroyed one) is announced again
    col = Collector(d.pid)
    try:
        d.run("single 0")
        assert list(comm_inits(col.take())) == [ctx_ids[inits[0x1234abcd]]]
        mask, calls = d.run("group2 0")
        assert mask == WIDE and observed(col.take()) == expected(calls, ctx_ids)
    finally:
        col.close()
    assert "NCCLLOG 2" not in d.close()


def test_the_agent_widens_a_mask_set_from_outside_and_leaves_it_on_detach(
        bpf_ready: None, run_driver: Any, plugin: Path) -> None:
    """NCCL 2.32's RAS override (ncclProfilerSetRasOverride) stores NCCL's mask from outside the plugin."""
    proxy_op = 0x8
    d = run_driver(plugin, 6)
    init = d.run("init 0x1234abcd 0 2 world")[1][0]["ctx"]
    assert d.run(f"ras {proxy_op:#x}")[0] == proxy_op
    col = Collector(d.pid)
    try:
        assert d.run("single 0")[0] == proxy_op | WIDE
        ctx_ids = {init: next(iter(comm_inits(col.take())))}
        mask, calls = d.run("group2 0")
        assert mask == proxy_op | WIDE and observed(col.take()) == expected(calls, ctx_ids) != []
    finally:
        col.close()
    assert d.run("single 0")[0] == proxy_op | NARROW
    d.close()

