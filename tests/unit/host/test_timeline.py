"""otel_ebpf.host.timeline: cumulative host counters over time, step figures, straggler figures."""
from __future__ import annotations

import threading

import pytest

from otel_ebpf.host.timeline import HostStats, StepTracker, step_attribute_name, straggler_attributes
from otel_ebpf.core.telemetry import DROPPED, Telemetry

MS = 1_000_000


def test_delta_interpolates_between_samples() -> None:
    hs = HostStats()
    hs.add(1, 0, io_ns=0)
    hs.add(1, 100 * MS, io_ns=50 * MS)
    hs.add(1, 200 * MS, io_ns=50 * MS)
    assert hs.delta(1, 0, 100 * MS) == {"io_ns": 50 * MS}
    assert hs.delta(1, 50 * MS, 150 * MS) == {"io_ns": pytest.approx(25 * MS)}
    assert hs.delta(1, 100 * MS, 200 * MS) == {"io_ns": 0}


def test_counter_unknown_before_its_first_sample_is_left_out() -> None:
    hs = HostStats()
    hs.add(1, 100, page_faults=10)
    hs.add(1, 50, io_ns=5)  # another feeder, its own times
    hs.add(1, 200, page_faults=30, io_ns=25)
    assert hs.delta(1, 60, 200) == {"io_ns": pytest.approx(25 - (5 + 20 * 10 / 150))}  # no page_faults at 60
    assert hs.delta(1, 100, 200) == {"io_ns": pytest.approx(25 - (5 + 20 * 50 / 150)), "page_faults": 20}


def test_threads_are_their_own_series() -> None:
    hs = HostStats()
    hs.add(7, 0, on_cpu_ns=0)
    hs.add(7, 10, on_cpu_ns=10)
    hs.add(7, 0, tid=8, on_cpu_ns=0)
    hs.add(7, 10, tid=8, on_cpu_ns=3)
    assert hs.delta(7, 0, 10) == {"on_cpu_ns": 10}
    assert hs.delta(7, 0, 10, tid=8) == {"on_cpu_ns": 3}
    assert hs.delta(9, 0, 10) == {}


def test_a_growing_counter_goes_on_past_the_newest_sample_up_to_the_limit() -> None:
    """What the thread was doing at the newest sample (here: running) is taken to go on, so a
    step ending between two of the feeder's samples is not cut short; others stay flat."""
    hs = HostStats(extrapolate_ns=100)
    hs.add(1, 0, tid=2, on_cpu_ns=0, runq_ns=0)
    hs.add(1, 40, tid=2, growing="on_cpu_ns", on_cpu_ns=30, runq_ns=10)
    assert hs.delta(1, 0, 70, tid=2) == {"on_cpu_ns": 60, "runq_ns": 10}
    assert hs.delta(1, 0, 1000, tid=2) == {"on_cpu_ns": 130, "runq_ns": 10}  # 100 ns past at most
    hs.add(1, 90, tid=2, growing="runq_ns", on_cpu_ns=70, runq_ns=15)  # a newer sample replaces the guess
    assert hs.delta(1, 0, 70, tid=2) == {"on_cpu_ns": pytest.approx(54), "runq_ns": pytest.approx(13)}
    assert hs.delta(1, 90, 100, tid=2) == {"on_cpu_ns": 0, "runq_ns": 10}
    hs.add(1, 95, tid=2, on_cpu_ns=70, runq_ns=20)  # nothing growing
    assert hs.delta(1, 95, 500, tid=2) == {"on_cpu_ns": 0, "runq_ns": 0}


def test_bounds_evict_oldest_keys_and_watches_and_count_it() -> None:
    tel = Telemetry()
    hs = HostStats(tel, max_keys=2, max_samples=3, max_watched=1)
    for pid in (1, 2, 3):
        hs.add(pid, 0, x=0)
    assert len(hs) == 2 and hs.delta(1, 0, 0) == {}
    assert tel.get(DROPPED, receiver="host_stats", reason="key_evicted") == 1
    for t in range(10):
        hs.add(3, t, x=t * t)  # no two steps at one rate: nothing to merge
    assert hs.delta(3, 0, 9) == {}  # t=0 aged out of the 3-sample window
    assert hs.delta(3, 7, 9) == {"x": 81 - 49}
    hs.watch(1, 11)
    hs.watch(1, 12)
    assert hs.watched() == [(1, 12)]
    assert tel.get(DROPPED, receiver="host_stats", reason="watch_evicted") == 1
    hs.forget(3)
    assert hs.delta(3, 7, 9) == {}


def test_add_and_delta_from_many_threads() -> None:
    hs = HostStats(max_keys=64)

    def feed(pid: int) -> None:
        for t in range(500):
            hs.add(pid, t, n=2 * t)
            hs.delta(pid, 0, t)

    threads = [threading.Thread(target=feed, args=(p,)) for p in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(hs.delta(p, 0, 499) == {"n": 998} for p in range(8))


def test_step_attribute_names() -> None:
    assert step_attribute_name("off_cpu_sleep_ns") == "ml.step.off_cpu.sleep.duration"
    assert step_attribute_name("runq_ns") == "ml.step.runq.duration"
    assert step_attribute_name("on_cpu_ns") == "ml.step.on_cpu.duration"
    assert step_attribute_name("io_ns") == "ml.step.io.duration"
    assert step_attribute_name("page_faults") == "ml.step.page_faults"


def test_step_tracker_reports_the_interval_since_the_previous_call() -> None:
    hs = HostStats()
    steps = StepTracker(hs)
    for t, sleep, runq in ((0, 0, 0), (100, 180, 1), (200, 180, 3)):
        hs.add(5, t * MS, tid=6, off_cpu_sleep_ns=sleep * MS, off_cpu_io_ns=0, off_cpu_lock_ns=0,
               off_cpu_other_ns=0, runq_ns=runq * MS, on_cpu_ns=0)
    hs.add(5, 0, page_faults=0)
    hs.add(5, 200 * MS, page_faults=8)
    assert steps.attributes("comm", 5, 6, 0, 10 * MS) == {}  # first call: no previous one
    assert hs.watched() == [(5, 6)]
    a = steps.attributes("comm", 5, 6, 100 * MS, 110 * MS)  # step = [10 ms, 100 ms]
    assert a["ml.step.off_cpu.duration"] == pytest.approx(0.18 * 90 / 100)
    assert a["ml.step.off_cpu.sleep.duration"] == pytest.approx(0.18 * 90 / 100)
    assert a["ml.step.runq.duration"] == pytest.approx(0.001 * 90 / 100)
    assert a["ml.step.page_faults"] == pytest.approx(8 * 90 / 200)
    assert a["ml.step.interval.duration"] == pytest.approx(0.09)
    b = steps.attributes("comm", 5, 6, 200 * MS, 210 * MS)  # [110 ms, 200 ms]: no more sleep
    assert b["ml.step.off_cpu.duration"] == pytest.approx(0.0)
    assert StepTracker(None).attributes("c", 1, 1, 0, 1) == {}


def test_straggler_attributes_next_to_the_median_of_the_others() -> None:
    ranks = {0: {"ml.step.off_cpu.duration": 0.002, "nccl.rank": 0},
             1: {"ml.step.off_cpu.duration": 0.001},
             2: {"ml.step.off_cpu.duration": 0.004},
             3: {"ml.step.off_cpu.duration": 0.180, "ml.step.page_faults": 12, "ml.flag": True}}
    out = straggler_attributes(ranks, 3)
    assert out == {"nccl.straggler.off_cpu.duration": 0.180, "nccl.peers_median.off_cpu.duration": 0.002,
                   "nccl.straggler.page_faults": 12}
    assert straggler_attributes({0: {"ml.step.x": 1.0}, 1: {"ml.step.x": 3.0}, 2: {"ml.step.x": 9.0}}, 2) == {
        "nccl.straggler.x": 9.0, "nccl.peers_median.x": 2.0}
    assert straggler_attributes({0: {}, 1: {"nccl.rank": 1}}, 1) == {}


def test_steady_rates_are_merged_so_the_window_outlives_max_samples() -> None:
    hs = HostStats(max_samples=4)
    for i in range(1000):  # 1 s of 1 ms samples: idle for 0.5 s, then busy at a steady rate
        t = i * MS
        hs.add(1, t, tid=2, on_cpu_ns=max(0, t - 500 * MS), off_cpu_sleep_ns=min(t, 500 * MS))
    assert hs.delta(1, 0, 999 * MS, tid=2) == {"on_cpu_ns": 499 * MS, "off_cpu_sleep_ns": 500 * MS}
    assert hs.delta(1, 100 * MS, 600 * MS, tid=2) == {"on_cpu_ns": 100 * MS, "off_cpu_sleep_ns": 400 * MS}


def test_a_step_ending_after_the_newest_sample_asks_the_feeder_for_a_fresh_one() -> None:
    """The spin the stale sample missed: sampled at 20 ms while runnable (not growing on-CPU),
    then on CPU until the step's end at 100 ms; the on-demand read at 110 ms has it all."""
    telemetry = Telemetry()
    hs = HostStats(telemetry)
    asked: list[tuple[int, int]] = []

    def sampler(pid: int, tid: int) -> None:
        asked.append((pid, tid))
        hs.add(pid, 110 * MS, tid=tid, on_cpu_ns=90 * MS)

    hs.add(5, 0, tid=6, on_cpu_ns=0)
    hs.add(5, 20 * MS, tid=6, on_cpu_ns=10 * MS, growing="runq_ns")
    steps = StepTracker(hs)
    steps.attributes("comm", 5, 6, 0, 0)
    hs.set_sampler(sampler)
    a = steps.attributes("comm", 5, 6, 100 * MS, 101 * MS)
    assert asked == [(5, 6)]
    # interpolated between 20 ms (10) and 110 ms (90): 10 + 80 x 80/90; without the read: 10
    assert a["ml.step.on_cpu.duration"] == pytest.approx((10 + 80 * 80 / 90) / 1e3)
    steps.attributes("comm", 5, 6, 105 * MS, 106 * MS)  # 110 ms sample covers 105 ms: no read
    assert asked == [(5, 6)]
    hs.set_sampler(lambda pid, tid: 1 / 0)
    steps.attributes("comm", 5, 6, 200 * MS, 201 * MS)
    assert telemetry.get(DROPPED, receiver="host_stats", reason="sample_error") == 1
    hs.set_sampler(None)
    steps.attributes("comm", 5, 6, 300 * MS, 301 * MS)
    assert telemetry.get(DROPPED, receiver="host_stats", reason="sample_error") == 1
