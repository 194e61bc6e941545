"""The agent's NCCL receiver on the plugin (receivers/nccl/profiler.py, nccl_prof.bpf.c): the driver (driver.c, the
NCCL 2.28.9 model) runs the built plugin; the receiver attaches the plugin's probes with their semaphores, decodes
communicators and planned collectives/p2p as NCCL passed them, and sums each op's kernel channels in the kernel
into one GPU record: its first channel start and last channel stop, as the driver's trace has them."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.nccl import Config
from otel_ebpf.receivers.nccl.events import NcclProfColl, NcclProfComm, NcclProfGpu, NcclProfP2P
from otel_ebpf.receivers.nccl.receiver import NcclReceiver
from tests.nccl_profiler.conftest import NARROW, WIDE

pytestmark = pytest.mark.bpf

COLL, P2P, KERNEL_CH, KERNEL_CH_STOP = 0x2, 0x4, 0x40, 22


def expected_gpu(trace: list[dict[str, Any]]) -> dict[int, tuple[int, int, int]]:
    """op handle -> (first channel start, last channel stop, channels) from the driver's trace of plugin calls."""
    parent = {c["h"]: c["parent"] for c in trace if c["ev"] == "start" and c["type"] == KERNEL_CH}
    out: dict[int, tuple[int, int, int]] = {}
    for c in trace:
        if c["ev"] == "start" and c["type"] == KERNEL_CH:
            lo, hi, n = out.get(c["parent"], (1 << 64, 0, 0))
            out[c["parent"]] = (min(lo, c["ptimer"]), hi, n)
        elif c["ev"] == "record" and c["state"] == KERNEL_CH_STOP:
            lo, hi, n = out[parent[c["h"]]]
            out[parent[c["h"]]] = (lo, max(hi, c["ptimer"]), n + 1)
    return out


def test_the_receiver_decodes_the_plugin_and_sums_each_ops_gpu_time(
        bpf_ready: None, run_driver: Any, plugin: Path) -> None:
    d = run_driver(plugin, 5)
    d.run("init 0x1234abcd 1 2 world")  # before the agent: announced again at the first group after the attach
    sink = ListConsumer()
    rx = NcclReceiver(Context(target_pids=[d.pid]), sink, Config(pause_on_load=False))
    rx.start()
    try:
        mask, _ = d.run("single 0")
        assert mask == WIDE
        trace: list[dict[str, Any]] = []
        for command in ("group2 0", "p2p 0", "single 0"):
            trace += d.run(command)[1]
        deadline = time.monotonic() + 10
        while len([e for e in sink.events if isinstance(e, NcclProfGpu)]) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rx.shutdown()
    assert d.run("single 0")[0] == NARROW  # the semaphores dropped with the receiver
    events = sink.take()
    (comm,) = {e for e in events if isinstance(e, NcclProfComm)}
    assert (comm.comm_hash, comm.rank, comm.nranks, comm.nnodes, comm.name) == (0x1234abcd, 1, 2, 1, "world")
    ops = {e.handle: e for e in events if isinstance(e, (NcclProfColl, NcclProfP2P))}
    planned = {c["h"]: c for c in trace if c["ev"] == "start" and c["type"] in (COLL, P2P)}
    assert set(ops) == set(planned) and len(ops) == 5
    for h, c in planned.items():
        op = ops[h]
        assert op.context == comm.context and op.pid == d.pid and op.count == c["count"] and op.group == c["group"]
        if isinstance(op, NcclProfColl):
            assert (op.func, op.seq, op.datatype) == ("AllReduce", c["seq"], "ncclFloat32")
            assert op.algo and op.proto and op.nchannels == 2
        else:
            assert (op.func, op.peer) == (c["func"], c["peer"])
    gpu = {e.handle: (e.gpu_start, e.gpu_stop, e.channels) for e in events if isinstance(e, NcclProfGpu)}
    assert gpu == expected_gpu(trace)
    assert all(hi > lo for lo, hi, _ in gpu.values())
    assert rx.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="nccl") == 0
