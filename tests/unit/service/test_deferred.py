"""otel_ebpf.service.deferred: the background starter of a deferred start, on receivers that stand in
for BPF ones (their start is what is observed: raising, or blocking as a compile does)."""
from __future__ import annotations

import threading

from otel_ebpf.core.pipeline import Context
from otel_ebpf.service.deferred import RECEIVERS_FAILED, DeferredStart, descendants, split_start


class FakeReceiver:
    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.fail, self.gate = fail, gate
        self.started = self.stopped = False
        self.bpf = None

    def start(self) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise RuntimeError("BPF program failed to load: simulated")
        self.started = True

    def shutdown(self) -> None:
        self.stopped = True


def test_a_receiver_that_fails_is_counted_and_the_others_still_start() -> None:
    ctx = Context()
    bad, good = FakeReceiver(fail=True), FakeReceiver()
    d = DeferredStart(ctx, {"cuda": bad, "nccl": good}, None, 0.0)
    d.start()
    assert d.done.wait(10)
    assert list(d.failed) == ["cuda"] and "simulated" in d.failed["cuda"]
    assert ctx.telemetry.get(RECEIVERS_FAILED, receiver="cuda") == 1
    assert d.started == {"nccl": good} and good.started and bad.stopped


def test_a_receiver_whose_start_ends_after_the_stop_is_shut_down_by_the_starter() -> None:
    release = threading.Event()
    slow, never = FakeReceiver(gate=release), FakeReceiver()
    d = DeferredStart(Context(), {"cuda": slow, "nccl": never}, None, 0.0)
    d.start()
    assert d.stop() == {}  # returns at once: the agent never waits for a compile
    release.set()
    assert d.done.wait(10)
    assert slow.started and slow.stopped and d.started == {}
    assert not never.started  # nothing starts after the stop


def test_an_exiting_agent_waits_for_the_compile_in_progress_and_no_longer() -> None:
    """Agent.shutdown(exiting=True) ends with finish(): no compile may run into the interpreter's exit (LLVM's
    static destructors aborted a `run` whose command ended while a receiver compiled)."""
    release = threading.Event()
    slow = FakeReceiver(gate=release)
    d = DeferredStart(Context(), {"cuda": slow}, None, 0.0)
    d.start()
    d.stop()
    assert not d.finish(0.2)  # still compiling: it says so and gives up after the bound
    threading.Timer(0.3, release.set).start()
    assert d.finish(10)
    assert slow.started and slow.stopped  # the starter shut its receiver down before finish returned
    nothing = DeferredStart(Context(), {}, None, 0.0)
    nothing.start()  # nothing late: the end of the start ran in start()
    assert nothing.finish(0.0)


def test_only_bpf_receivers_not_marked_early_are_late() -> None:
    from otel_ebpf.receivers.blockio.receiver import BlockIoReceiver
    from otel_ebpf.receivers.lifecycle.receiver import LifecycleReceiver

    assert not BlockIoReceiver.start_early and LifecycleReceiver.start_early
    early, late = split_start({"nvml": object(), "x": FakeReceiver()})
    assert set(early) == {"nvml", "x"} and late == {}  # not BPF receivers: they start before the command


def test_descendants_are_found_through_the_parent_chain() -> None:
    import subprocess

    sh = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        for _ in range(100):
            kids = descendants([sh.pid])
            if len(kids) == 2:
                break
            threading.Event().wait(0.02)
        assert len(kids) == 2 and sh.pid not in kids
    finally:
        subprocess.run(["pkill", "-P", str(sh.pid)])
        sh.wait(10)


def test_the_gate_compiles_into_lifecycle_when_it_is_early_and_stands_alone_otherwise() -> None:
    from otel_ebpf.bpf.gate import LibraryGate
    from otel_ebpf.bpf.gate_hosted import QUEUE_MAX, HostedGate
    from otel_ebpf.core.pipeline import ListConsumer
    from otel_ebpf.receivers.cuda import Config as CudaConfig
    from otel_ebpf.receivers.cuda.receiver import CudaReceiver
    from otel_ebpf.receivers.lifecycle import Config as LifecycleConfig
    from otel_ebpf.receivers.lifecycle import LifecycleReceiver
    from otel_ebpf.service.deferred import plan

    ctx = Context(target_pids=[1])
    lifecycle, cuda = LifecycleReceiver(LifecycleConfig(), ctx, ListConsumer()), CudaReceiver(CudaConfig(), ctx,
                                                                                             ListConsumer())
    early, late, gate = plan(ctx, {"lifecycle": lifecycle, "cuda": cuda})
    assert set(early) == {"lifecycle"} and set(late) == {"cuda"} and isinstance(gate, HostedGate)
    flags = lifecycle.program_cflags()
    assert "-DOE_GATE=1" in flags and '-DOE_LIB_PATTERN="libcuda"' in flags
    assert [f for f in flags if f.startswith("-DOE_PAUSE_ON_LOAD=")] == ["-DOE_PAUSE_ON_LOAD=1"]
    for _ in range(QUEUE_MAX + 2):  # a full queue: counted, never blocking the host's poll thread
        gate.enqueue(b"x")
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="gate", reason="gate_queue_full") == 2
    gate.shutdown()  # never started: nothing to resume
    gate.enqueue(b"x")  # after the shutdown: ignored, not counted
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="gate", reason="gate_queue_full") == 2

    alone = CudaReceiver(CudaConfig(), ctx, ListConsumer())
    _, _, own = plan(ctx, {"cuda": alone})
    assert type(own) is LibraryGate
