"""The agent's NCCL receiver on the plugin (receivers/nccl/profiler.py, nccl_prof.bpf.c): the driver (driver.c, the
NCCL 2.28.9 model) runs the built plugin; the receiver attaches the plugin's probes with their semaphores, decodes
communicators, and sends each collective/p2p once, as NCCL planned it with its kernel channels summed in the kernel:
its first channel start and last channel stop, as the driver's trace has them. The kernel's tables are swept."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.bpf import links
from otel_ebpf.receivers.nccl import Config
from otel_ebpf.receivers.nccl.events import NcclProfColl, NcclProfComm, NcclProfP2P
from otel_ebpf.receivers.nccl.receiver import NcclReceiver
from tests.nccl_profiler.conftest import NARROW, WIDE
from tests.support.uprobe_links import uprobe_links

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
        # where the kernel has uprobe links, the plugin's probes are links that carry their semaphores
        ours = [link for link in uprobe_links() if link.path == os.path.realpath(plugin)]
        assert (ours and all(link.ref_ctr_offsets[0] for link in ours)) or not links.supported(), ours
        trace: list[dict[str, Any]] = []
        for command in ("group2 0", "p2p 0", "single 0"):
            trace += d.run(command)[1]
        deadline = time.monotonic() + 10
        while len([e for e in sink.events if isinstance(e, (NcclProfColl, NcclProfP2P))]) < 5 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        left = (len(rx.bpf["prof_ops"]), len(rx.bpf["prof_chs"]))
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
    assert left == (0, 0)  # every op and channel freed at its last stop
    gpu = {h: (op.gpu_start, op.gpu_stop, op.channels) for h, op in ops.items()}
    assert gpu == expected_gpu(trace)
    assert all(hi > lo for lo, hi, _ in gpu.values())
    assert rx.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="nccl") == 0


def test_full_tables_are_counted_and_the_sweep_frees_stale_and_exited_ops(
        bpf_ready: None, run_driver: Any, plugin: Path) -> None:
    """prof_ops full: the op is not timed and counted (gpu_ops_full). The sweep frees an op of an exited
    process silently and one older than GPU_OP_MAX_AGE_S (a kernel that never ended) counted as gpu_op_expired."""
    d = run_driver(plugin, 5)
    d.run("init 0x1234abcd 0 2 world")
    sink = ListConsumer()
    rx = NcclReceiver(Context(target_pids=[d.pid]), sink, Config(pause_on_load=False))
    rx.start()
    try:
        assert d.run("single 0")[0] == WIDE  # the plugin widens NCCL's mask at the first group after the attach
        ops = rx.bpf["prof_ops"]
        now = time.monotonic_ns()
        for i in range(rx.bpf["prof_ops"].max_entries):  # a live process's ops, all but one far too old
            key, leaf = ops.Key(), ops.Leaf()
            key.tgid, key.handle = d.pid, 1 << 40 | i
            leaf.op.ts, leaf.expected = (now if i == 0 else now - int(400e9)), 2
            ops[key] = leaf
        d.run("single 0")
        rx.poll_maps()
        assert rx.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="nccl", reason="gpu_ops_full") == 1
        gone = ops.Key()
        gone.tgid, gone.handle = 0x3ffffff0, 1  # no such process
        del ops[ops.Key(d.pid, 0, 1 << 40 | 1)]
        ops[gone] = ops.Leaf()
        freed = rx.sweep()
        assert len(ops) == 1 and ops[ops.Key(d.pid, 0, 1 << 40)].expected == 2  # the young op stays
        expired = ops.max_entries - 2
        assert rx.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="nccl", reason="gpu_op_expired") == expired
        assert freed >= expired + 1
    finally:
        rx.shutdown()
