"""Host context over time: cumulative per-process (or per-thread) counters that receivers feed,
and the figures over an interval that processors ask for ("why was this rank late").

Receivers call ``ctx.host_stats.add(pid, time_ns, **counters)`` with CUMULATIVE counters
(nanoseconds or counts since the process started, e.g. ``off_cpu_sleep_ns``, ``io_ns``,
``page_faults``), each counter at its own times: several receivers may feed one pid.
``delta(pid, start_ns, end_ns)`` interpolates every counter linearly between the samples
around ``start_ns`` and around ``end_ns`` and returns the differences. A counter with no sample
at or before ``start_ns`` is left out (its value then is unknown). Past its newest sample the
newest value is used, plus, for the counter the feeder said was ``growing`` then (a thread's
state: on CPU, asleep, in the run queue), the time since that sample, up to ``extrapolate_ns``:
a step that ends between two samples is not cut short by up to one feeder interval.

``tid`` (keyword) selects a thread's own series instead of the process's (0). Thread series
are only sampled for threads someone asked about: ``watch(pid, tid)`` (done by
:class:`StepTracker`) registers them, :meth:`HostStats.watched` lists them for the receiver.

Bounds: ``max_keys`` (pid, tid) series sets, least recently fed evicted first (counted as
``otel_ebpf.events.dropped{receiver=host_stats, reason=key_evicted}``); ``max_samples`` samples
per counter (older ones age out; a sample on the line between its neighbours is merged, so
the window is ``max_samples`` changes of rate, at least ``max_samples`` x the feeder's interval);
``max_watched`` threads watched (least recently asked first out, counted as ``watch_evicted``).

Fresh figures: a step that ends after the newest sample of its thread would be extrapolated
from a sample up to one feeder interval old (more when the feeder's thread is starved: on a
loaded 2-CPU host a 100 ms step once read 43 ms). A feeder that can read one thread's counters
at any time registers that reader with :meth:`HostStats.set_sampler`; :meth:`HostStats.fresh`
(called by :class:`StepTracker` before each step's figures) runs it when the thread's newest
sample is older than the step's end, so the step's end is interpolated between two samples.
The reader runs on the asking thread, outside the store's lock, must be thread-safe and must
not block (the sched receiver's reads one BPF map entry); its failures are counted as
``otel_ebpf.events.dropped{receiver=host_stats, reason=sample_error}``.

Thread safety: every method may be called from any thread (one lock, never held while a
feeder's reader runs).
"""
from __future__ import annotations

import bisect
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from otel_ebpf.core.services import HostTimeline

__all__ = ["HostStats", "StepTracker", "has_step_figures", "step_attribute_name", "straggler_attributes",
           "straggler_figures", "why_late"]

Key = tuple[int, int]  # (pid, tid); tid 0: the whole process
_TELEMETRY_NAME = "host_stats"


class _Series:
    """One counter's samples, in time order (bounded)."""

    __slots__ = ("growing", "times", "values")

    def __init__(self, max_samples: int) -> None:
        self.times: deque[int] = deque(maxlen=max_samples)
        self.values: deque[float] = deque(maxlen=max_samples)
        self.growing = False  # at the newest sample, the counter was growing at 1 ns per ns

    def add(self, time_ns: int, value: float, growing: bool = False) -> None:
        if self.times and time_ns < self.times[-1]:
            return  # out of order: keep the series monotonic in time
        self.growing = growing
        if self.times and time_ns == self.times[-1]:
            self.values[-1] = value
            return
        if len(self.times) >= 2 and self._collinear(time_ns, value):
            self.times[-1], self.values[-1] = time_ns, value  # a steady rate: one segment
            return
        self.times.append(time_ns)
        self.values.append(value)

    def _collinear(self, t: int, v: float) -> bool:
        """Whether the newest sample lies on the line from the one before it to (t, v): then
        it can be dropped without changing any interpolated value (idle or steadily busy
        threads keep a window of hours instead of max_samples x the feeder's interval)."""
        t0, t1 = self.times[-2], self.times[-1]
        v0, v1 = self.values[-2], self.values[-1]
        expected = v0 + (v - v0) * (t1 - t0) / (t - t0)
        return abs(expected - v1) <= 0.5 + 1e-9 * abs(v - v0)

    def at(self, t: int, extrapolate_ns: int) -> float | None:
        """The value at ``t``: linear between the samples around it; after the newest sample,
        the newest value (+ the time since it, up to ``extrapolate_ns``, while ``growing``);
        None before the oldest (unknown)."""
        times = self.times
        if not times or t < times[0]:
            return None
        i = bisect.bisect_right(times, t)
        if i >= len(times):
            return self.values[-1] + (min(t - times[-1], extrapolate_ns) if self.growing else 0)
        t0, t1 = times[i - 1], times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


class HostStats:
    """Thread-safe, bounded store of cumulative counters per (pid, tid) over time.

    ``extrapolate_ns``: longest a ``growing`` counter is taken to go on growing past its newest
    sample (a few times the feeders' interval: the sched receiver samples every 20 ms)."""

    def __init__(self, telemetry: Any = None, *, max_keys: int = 4096, max_samples: int = 512,
                 max_watched: int = 256, extrapolate_ns: int = 100_000_000) -> None:
        self._lock = threading.Lock()
        self._series: OrderedDict[Key, dict[str, _Series]] = OrderedDict()
        self._watched: OrderedDict[Key, None] = OrderedDict()
        self._max_keys, self._max_samples, self._max_watched = max_keys, max_samples, max_watched
        self._extrapolate_ns = extrapolate_ns
        self._sampler: Callable[[int, int], None] | None = None
        self.telemetry = telemetry

    def _dropped(self, reason: str) -> None:
        if self.telemetry is not None:
            self.telemetry.dropped(_TELEMETRY_NAME, reason)

    def add(self, pid: int, time_ns: int, *, tid: int = 0, growing: str = "", **counters: float) -> None:
        """Cumulative ``counters`` of process ``pid`` (or its thread ``tid``) at ``time_ns``;
        ``growing``: the one of them rising at 1 ns per ns then (e.g. ``on_cpu_ns`` while the
        thread runs), if any."""
        key = (pid, tid)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                while len(self._series) >= self._max_keys:
                    self._series.popitem(last=False)
                    self._dropped("key_evicted")
                series = self._series[key] = {}
            else:
                self._series.move_to_end(key)
            for name, value in counters.items():
                s = series.get(name)
                if s is None:
                    s = series[name] = _Series(self._max_samples)
                s.add(time_ns, float(value), name == growing)

    def delta(self, pid: int, start_ns: int, end_ns: int, *, tid: int = 0) -> dict[str, float]:
        """Each counter's increase over [start_ns, end_ns] (see the module doc); {} if none."""
        if end_ns < start_ns:
            return {}
        out: dict[str, float] = {}
        limit = self._extrapolate_ns
        with self._lock:
            for name, s in self._series.get((pid, tid), {}).items():
                a, b = s.at(start_ns, limit), s.at(end_ns, limit)
                if a is not None and b is not None:
                    out[name] = max(0.0, b - a)
        return out

    def set_sampler(self, sampler: Callable[[int, int], None] | None) -> None:
        """The feeder's reader of one thread's counters now (``sampler(pid, tid)`` calls
        :meth:`add`), or None to unregister (the feeder stops)."""
        self._sampler = sampler

    def fresh(self, pid: int, tid: int, time_ns: int) -> None:
        """Make sure thread ``tid`` has a sample at or after ``time_ns`` if a reader can give
        one: runs the registered sampler when the thread's newest sample is older (see the
        module doc). Never raises."""
        sampler = self._sampler
        if sampler is None or not tid:
            return
        with self._lock:
            series = self._series.get((pid, tid))
            newest = max((s.times[-1] for s in series.values() if s.times), default=None) if series else None
        if newest is not None and newest >= time_ns:
            return
        try:
            sampler(pid, tid)
        except Exception:
            self._dropped("sample_error")

    def watch(self, pid: int, tid: int) -> None:
        """Ask feeders to sample this thread from now on (bounded, most recent kept)."""
        key = (pid, tid)
        with self._lock:
            if key in self._watched:
                self._watched.move_to_end(key)
                return
            while len(self._watched) >= self._max_watched:
                self._watched.popitem(last=False)
                self._dropped("watch_evicted")
            self._watched[key] = None

    def watched(self) -> list[Key]:
        with self._lock:
            return list(self._watched)

    def forget(self, pid: int) -> None:
        """Drop every series and watch of ``pid`` (the process is gone and reported)."""
        with self._lock:
            for key in [k for k in self._series if k[0] == pid]:
                del self._series[key]
            for key in [k for k in self._watched if k[0] == pid]:
                del self._watched[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._series)


def step_attribute_name(counter: str) -> str:
    """``off_cpu_sleep_ns`` -> ``ml.step.off_cpu.sleep.duration``; ``page_faults`` ->
    ``ml.step.page_faults`` (the rule for counters fed by any receiver)."""
    if counter.endswith("_ns"):
        base = counter[:-3]
        for prefix in ("off_cpu", "on_cpu"):
            if base.startswith(prefix + "_"):
                base = prefix + "." + base[len(prefix) + 1:]
        return f"ml.step.{base}.duration"
    return f"ml.step.{counter}"


# Counters the sched receiver feeds per thread, summed into ml.step.off_cpu.duration.
_OFF_CPU = ("off_cpu_sleep_ns", "off_cpu_io_ns", "off_cpu_lock_ns", "off_cpu_other_ns")


class StepTracker:
    """For a processor: the host figures of the "step" before each call, i.e. the interval
    since the end of the previous call with the same ``key`` (e.g. (pid, communicator)) up to
    this call's start. Thread figures come from the calling thread's series, the rest from the
    process's. Not thread-safe (one processor thread); at most ``max_keys`` keys."""

    def __init__(self, stats: HostTimeline | None, max_keys: int = 4096) -> None:
        self._stats = stats
        self._last: OrderedDict[Any, int] = OrderedDict()
        self._max = max_keys

    def attributes(self, key: Any, pid: int, tid: int, start_ns: int, end_ns: int) -> dict[str, float]:
        """Span attributes for this call (empty for the first call of ``key``); never raises."""
        stats = self._stats
        if stats is None:
            return {}
        try:
            prev = self._last.pop(key, None)
            self._last[key] = end_ns
            while len(self._last) > self._max:
                self._last.popitem(last=False)
            stats.watch(pid, tid)
            if prev is None or start_ns < prev:
                return {}
            stats.fresh(pid, tid, start_ns)
            return _attrs(stats.delta(pid, prev, start_ns, tid=tid),
                          stats.delta(pid, prev, start_ns), start_ns - prev)
        except Exception:
            telemetry = getattr(stats, "telemetry", None)
            if telemetry is not None:
                telemetry.dropped(_TELEMETRY_NAME, "step_error")
            return {}


def _attrs(thread: Mapping[str, float], process: Mapping[str, float], interval_ns: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for source in (process, thread):  # the thread's own figures win over the process's
        for name, value in source.items():
            out[step_attribute_name(name)] = value / 1e9 if name.endswith("_ns") else value
    if any(n in thread for n in _OFF_CPU):
        out["ml.step.off_cpu.duration"] = sum(thread.get(n, 0.0) for n in _OFF_CPU) / 1e9
    if out:
        out["ml.step.interval.duration"] = interval_ns / 1e9
    return out


_STEP = "ml.step."


def has_step_figures(attrs: Mapping[str, Any]) -> bool:
    """Whether a span carries any ``ml.step.X`` figure (else :func:`straggler_attributes` of it is {})."""
    return any(name.startswith(_STEP) for name in attrs)


def straggler_attributes(rank_attrs: Mapping[int, Mapping[str, Any]], straggler: int) -> dict[str, float]:
    """For a joined collective: each ``ml.step.X`` figure of the straggler's span as
    ``nccl.straggler.X``, next to ``nccl.peers_median.X``, the median over the other ranks that
    have it ("rank 3 was off-CPU 180 ms vs 2 ms median"). {} when the straggler has none."""
    mine = rank_attrs.get(straggler) or {}
    out: dict[str, float] = {}
    for name, value in mine.items():
        if not name.startswith(_STEP) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        rest = name[len(_STEP):]
        out[f"nccl.straggler.{rest}"] = value
        peers = sorted(v for r, a in rank_attrs.items() if r != straggler
                       for v in (a.get(name),) if isinstance(v, (int, float)) and not isinstance(v, bool))
        if peers:
            mid = len(peers) // 2
            out[f"nccl.peers_median.{rest}"] = peers[mid] if len(peers) % 2 else (peers[mid - 1] + peers[mid]) / 2
    return out


def straggler_figures(root_attrs: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """Read back what :func:`straggler_attributes` wrote on a joined collective's root:
    ``(figure, straggler's seconds, peers' median seconds)`` for each ``.duration`` figure but
    the interval (``on_cpu``, ``off_cpu.sleep``, ...)."""
    out = []
    for key, mine in root_attrs.items():
        if not (key.startswith("nccl.straggler.") and key.endswith(".duration")):
            continue
        figure = key[len("nccl.straggler."):-len(".duration")]
        peers = root_attrs.get(f"nccl.peers_median.{figure}.duration")
        if figure != "interval" and _number(mine) and isinstance(peers, (int, float)) and _number(peers):
            out.append((figure, float(mine), float(peers)))
    return out


def why_late(per_collective: Iterable[Sequence[tuple[str, float, float]]],
             min_gap_ms: float = 1.0) -> list[tuple[str, float, float]]:
    """Over the collectives one rank was late to (each as :func:`straggler_figures` gives it):
    ``(figure, its median ms, the peers' median ms)`` where it spent at least ``min_gap_ms``
    more than its peers, the largest gap first."""
    mine: dict[str, list[float]] = {}
    peers: dict[str, list[float]] = {}
    for figures in per_collective:
        for figure, value, median in figures:
            mine.setdefault(figure, []).append(value * 1e3)
            peers.setdefault(figure, []).append(median * 1e3)
    rows = [(f, statistics.median(v), statistics.median(peers[f])) for f, v in mine.items()]
    return sorted((r for r in rows if r[1] - r[2] >= min_gap_ms), key=lambda r: r[2] - r[1])


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
