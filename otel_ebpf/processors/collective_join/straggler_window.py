"""One communicator's window of recent complete collectives, and the test that names a persistent straggler
(:mod:`.stragglers`).

Each :class:`Entry` is one collective: its last rank when that rank started at least ``min_lead`` after the
next-to-last (its *lead*; else nobody), whether that lead was *strong* (at least ``strong_lead_factor`` times the
communicator's usual lead, the median of the last :data:`LEADS_KEPT` in the window), and, once GpuJoin has it,
whose kernel started last and why.

**Steps, not collectives.** A late host shifts all its calls until its next synchronisation, usually a training
step, so the collectives of one step are one draw of noise, not many. The window finds the steps without knowing
the job: within a step every rank's start relative to the median start stays the same (to the call's jitter);
when any of them moves by more than half the usual skew (first to last start, median of the last
:data:`LEADS_KEPT`) and by ``min_lead`` at least, the ranks' lateness was drawn anew. The *step* is the median time
between two such moves over the last :data:`RUNS_KEPT`; a straggler does not hide it (the other ranks still move).
The window keeps at most :data:`PER_STEP` collectives a step (the others of a step say the same), so it reaches
back :data:`DRAWS`'s longest in ``max_window`` entries.

**The test** (:meth:`Window.decide`, four times a step at most). For a rank last in the latest collective and in
``ratio`` of the latest 4 steps' collectives (a straggler now, not one that recovered within the longest suffix),
over the latest D steps for each D in :data:`DRAWS`: it must be last in ``ratio`` of the window's collectives there,
and one of two binomial tail probabilities under "nobody is slowed" must be below ``false_alarm_p``: being last in
that share of D steps when each step's last is any of the R ranks alike (1/R); or being the *strong* last in its
share of them when a strong last is as rare as the window's own history says (its share of strong leads, over
R; never 0). The first needs about a dozen steps with 4 ranks, twice that with 2; the second, for a rank late by
several times the job's usual lead, a handful, and more where the job's noise has long tails (hiccups, GC
pauses), because its own history then says strong leads are common. While no rank's lateness ever moved (ranks
in lock-step, one of them late by the same amount every time: no noise to be fooled by), the window rule of old
applies: ``ratio`` of at least ``window`` collectives over at least ``min_span``. Once it moved but fewer than
:data:`MIN_RUNS` steps were seen, nobody is named yet: the window rule named ranks on noise alone in jobs of long
steps (one or two steps in 50 collectives). Simulated figures: docs/collectives.md.

Single-threaded (the join's). Memory per communicator: ``max_window`` entries (each with its straggler figures,
shared with the join's root span), 256 leads and strong flags, 32 step lengths, one collective's offsets.
"""
from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import StragglerConfig

__all__ = ["CLEAR_STEPS", "DRAWS", "LEADS_KEPT", "PER_STEP", "RUNS_KEPT", "Decision", "Entry", "Window",
           "binomial_tail"]

RUNS_KEPT = 32  # step lengths kept (time between two new draws of the ranks' lateness)
MIN_RUNS = 8  # step lengths seen before the step counts
LEADS_KEPT = 256  # leads kept for the usual lead and the share of strong ones
MIN_LEADS = 64  # leads seen before a lead can be strong
PER_STEP = 8  # collectives a step the window keeps at most
KINDS_KEPT = 512  # the latest collectives' (op, count) kinds, for the loop's period
MAX_PERIOD = 128  # the longest period looked for, in collectives
CLEAR_STEPS = 12  # a raised rank's share is read over this many steps at least (one step's noise does not clear it)
MIN_SEEN = 96  # collectives seen before the step counts (the period looked for 3 times; a multiple of 32)
DRAWS = (4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)  # the suffixes tested, in steps


@dataclass(slots=True)
class Entry:
    """One complete collective: its last rank (None: nobody led by min_lead) and what that rank did."""

    start_ns: int
    rank: int | None
    lead_ns: int
    skew_ns: int
    op: str
    figures: Mapping[str, Any]
    seq: int = -1
    offsets: tuple[int, ...] = ()  # each rank's start - the median start, by rank (used once, then dropped)
    kind: int = 0  # a hash of (op, count): the training loop's sequence of these repeats once a step
    strong: bool = False  # the lead was at least strong_lead_factor times the usual one
    gpu_rank: int | None = None  # the rank whose kernel started last by min_lead (GpuJoin), once timed
    gpu_cause: str = ""  # its nccl.gpu.late.cause: host (arrived late) or gpu_queue (its stream was busy)
    gpu_lead_ns: int = 0  # nccl.gpu.skew_ns
    gpu_timed: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a rank was named: ``by`` "draws" (last in most of ``steps`` steps), "strong" (the strong last in most
    of them) or "window" (the old rule, the step not known yet); over the latest ``collectives`` entries
    reaching back ``reach_ns``; ``p``: the tail probability under nobody slowed (1.0 for "window")."""

    by: str
    steps: int
    collectives: int
    reach_ns: int
    p: float


class _Median:
    """The median of the latest ``size`` values (statistics.median's), kept sorted as they come and go: O(size)
    memmove per value instead of a sort per read (two are read for every collective)."""

    __slots__ = ("_order", "_sorted")

    def __init__(self, size: int) -> None:
        self._order: deque[int] = deque(maxlen=size)
        self._sorted: list[int] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: int) -> None:
        if len(self._order) == self._order.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self._order[0])]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, sum(math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(k, n + 1)))


@dataclass(slots=True)
class Window:
    """See the module doc. ``push`` then ``trim`` for each complete collective."""

    entries: deque[Entry] = field(default_factory=deque)
    counts: dict[int, int] = field(default_factory=dict)  # rank -> entries it was last in
    by_seq: dict[int, Entry] = field(default_factory=dict)  # the window's entries by seq (GPU sides join them)
    gpu_counts: dict[int, int] = field(default_factory=dict)  # rank -> entries its kernel started last in
    gpu_timed: int = 0  # entries with their GPU side
    leads: _Median = field(default_factory=lambda: _Median(LEADS_KEPT))
    strongs: deque[bool] = field(default_factory=lambda: deque(maxlen=LEADS_KEPT))
    runs: deque[int] = field(default_factory=lambda: deque(maxlen=RUNS_KEPT))  # ns between new draws
    last_offsets: tuple[int, ...] = ()  # the previous collective's offsets
    kinds: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=KINDS_KEPT))  # (kind, start ns)
    period_ns: int = 0  # how long the sequence of kinds takes to repeat (0: no period longer than one found)
    seen: int = 0  # collectives pushed
    skews: _Median = field(default_factory=lambda: _Median(LEADS_KEPT))  # first to last start, latest
    run_start_ns: int = 0
    nranks: int = 2
    next_test_ns: int = 0  # decide's next test (a quarter step on)
    next_gpu_test_ns: int = 0  # decide_gpu's
    next_clear_ns: int = 0  # clear_due's
    step: int = 0  # step_ns (kept by _restep)

    def step_ns(self) -> int:
        """The step as the new draws measure it (module doc), or the period of the loop's collectives when that
        is longer (lateness can also move at a synchronisation within a step); 0 until MIN_RUNS were seen."""
        return self.step

    def _restep(self) -> None:
        """step_ns's value, kept: read several times for every collective, it changes only with what it reads."""
        known = len(self.runs) >= MIN_RUNS and self.seen >= MIN_SEEN
        self.step = max(int(statistics.median(self.runs)), self.period_ns) if known else 0

    def _period(self) -> None:
        """The smallest P in which the last 3 P kinds repeat, and the median time P collectives take."""
        kinds = list(self.kinds)
        n = len(kinds)
        for p in range(1, min(MAX_PERIOD, n // 3) + 1):
            if all(kinds[i][0] == kinds[i - p][0] for i in range(n - 2 * p, n)):
                self.period_ns = int(statistics.median(kinds[i][1] - kinds[i - p][1] for i in range(n - 2 * p, n)))
                return
        self.period_ns = 0

    def push(self, entry: Entry, nranks: int, cfg: StragglerConfig) -> bool:
        """Takes the collective into the step's measure; into the window (and the leads) unless the window holds
        PER_STEP of this step already (returns whether it did)."""
        self.nranks = nranks
        offsets, entry.offsets = entry.offsets, ()
        self.skews.add(entry.skew_ns)
        moved = max(int(cfg.min_lead * 1e9), int(self.skews.median()) // 2)  # call jitter stays below
        if len(offsets) == len(self.last_offsets) and any(abs(a - b) >= moved for a, b in zip(
                offsets, self.last_offsets, strict=True)):  # the ranks' lateness was drawn anew: a new step
            if self.run_start_ns:
                self.runs.append(entry.start_ns - self.run_start_ns)
                self._restep()
            self.run_start_ns = entry.start_ns
        self.last_offsets = offsets
        self.kinds.append((entry.kind, entry.start_ns))
        self.seen += 1
        if self.seen % 32 == 0:
            self._period()
            self._restep()  # also where seen reaches MIN_SEEN (a multiple of 32)
        rank = entry.rank
        step = self.step_ns()
        if step and self.entries and entry.start_ns - self.entries[-1].start_ns < step // PER_STEP:
            return False  # the window holds PER_STEP of this step already: the rest say the same
        self.entries.append(entry)
        self.by_seq[entry.seq] = entry
        if rank is not None:
            self.counts[rank] = self.counts.get(rank, 0) + 1
            usual = self.leads.median() if len(self.leads) >= MIN_LEADS else 0
            entry.strong = usual > 0 and cfg.strong_lead_factor > 0 and entry.lead_ns >= cfg.strong_lead_factor * usual
            self.leads.add(entry.lead_ns)
            self.strongs.append(entry.strong)
        return True

    def span_ns(self, cfg: StragglerConfig) -> int:
        """How far back the window must reach: min_span, and the most steps tested once the step is known."""
        return max(int(cfg.min_span * 1e9), DRAWS[-1] * self.step_ns())

    def trim(self, cfg: StragglerConfig) -> None:
        """Drops what the window no longer needs: it keeps at least ``window`` entries over span_ns."""
        span, entries = self.span_ns(cfg), self.entries
        last = entries[-1].start_ns
        while len(entries) > cfg.max_window or (len(entries) > cfg.window and last - entries[1].start_ns >= span):
            self._pop()

    def reach_ns(self) -> int:
        """How far back the window reaches (collective start times)."""
        return self.entries[-1].start_ns - self.entries[0].start_ns if self.entries else 0

    def decide(self, rank: int, cfg: StragglerConfig) -> Decision | None:
        """Whether ``rank`` is a persistent straggler now (module doc); None: not (yet)."""
        step, entries = self.step_ns(), self.entries
        if not step:  # no step known: the window rule while the ranks' lateness never moved, else wait for steps
            full = len(entries) >= cfg.window and self.reach_ns() >= int(cfg.min_span * 1e9)
            if full and not self.run_start_ns and self.counts.get(rank, 0) >= cfg.ratio * len(entries):
                return Decision("window", 0, len(entries), self.reach_ns(), 1.0)
            return None
        now = entries[-1].start_ns
        if now < self.next_test_ns:
            return None
        self.next_test_ns = now + step // 4
        usual = 1.0 / self.nranks
        strong = (sum(self.strongs) + 1) / (len(self.strongs) + 2) / self.nranks  # never 0: Laplace's rule
        n = last = strongs = 0
        draws = iter(DRAWS)
        want = next(draws)
        for e in reversed(entries):
            if now - e.start_ns >= want * step:
                if last < cfg.ratio * n and want == DRAWS[0]:
                    return None  # not last in most of the latest steps: a straggler is one now, not 60 steps ago
                if last >= cfg.ratio * n:
                    p = binomial_tail(math.floor(last / n * want), want, usual)
                    if p < cfg.false_alarm_p:
                        return Decision("draws", want, n, now - e.start_ns, p)
                    p = binomial_tail(math.floor(strongs / n * want), want, strong)
                    if p < cfg.false_alarm_p:
                        return Decision("strong", want, n, now - e.start_ns, p)
                want = next(draws, 0)
                if not want:
                    return None
            n += 1
            if e.rank == rank:
                last += 1
                strongs += e.strong
        return None

    def latest(self, steps: int) -> int:
        """How many of the latest entries reach back ``steps`` steps (all when the step is unknown or 0)."""
        step, entries = self.step_ns(), self.entries
        if not step or not steps or not entries:
            return len(entries)
        now, n = entries[-1].start_ns, 0
        for e in reversed(entries):
            if now - e.start_ns >= steps * step:
                break
            n += 1
        return n

    def clear_due(self) -> bool:
        """Whether to read raised ranks' shares now: every collective while the step is unknown (the whole
        window's counts, O(1)), else once a quarter step (each read walks the latest steps)."""
        step = self.step_ns()
        if not step or not self.entries:
            return True
        now = self.entries[-1].start_ns
        if now < self.next_clear_ns:
            return False
        self.next_clear_ns = now + step // 4
        return True

    def settled(self, since_ns: int) -> bool:
        """CLEAR_STEPS steps have passed since ``since_ns`` (a raise): before, the steps its share is read over
        would still hold those before the raise, and one named a few steps in would be cleared at once."""
        step = self.step_ns()
        return not step or not self.entries or self.entries[-1].start_ns - since_ns >= CLEAR_STEPS * step

    def share(self, rank: int, steps: int) -> float:
        """``rank``'s share of last arrivals over the latest ``steps`` steps, CLEAR_STEPS at least (the whole
        window: see latest)."""
        n = self.latest(max(steps, CLEAR_STEPS) if steps else 0)
        if n == len(self.entries):
            return self.counts.get(rank, 0) / n if n else 0.0
        return sum(1 for e in list(self.entries)[-n:] if e.rank == rank) / n if n else 0.0

    def gpu_time(self, entry: Entry, rank: int | None, cause: str, lead_ns: int) -> None:
        """``entry``'s GPU side: ``rank`` started its kernel last by min_lead (None: nobody), for ``cause``."""
        entry.gpu_timed, entry.gpu_lead_ns = True, lead_ns
        self.gpu_timed += 1
        if rank is not None:
            entry.gpu_rank, entry.gpu_cause = rank, cause
            self.gpu_counts[rank] = self.gpu_counts.get(rank, 0) + 1

    def decide_gpu(self, rank: int, cfg: StragglerConfig) -> Decision | None:
        """Whether ``rank``'s kernel started last, mostly with its stream busy (cause gpu_queue), in ``ratio`` of the
        GPU-timed collectives of the latest D steps, with p < false_alarm_p of that being chance (each step's
        last kernel any of the R ranks' alike). While no step is known: the window rule, as for arrivals."""
        step, entries = self.step_ns(), self.entries
        if not step:
            full = self.gpu_timed >= cfg.window and self.reach_ns() >= int(cfg.min_span * 1e9)
            if full and not self.run_start_ns and self.gpu_share(rank) >= cfg.ratio \
                    and self.queued(rank) * 2 > self.gpu_counts.get(rank, 0):
                return Decision("window", 0, self.gpu_timed, self.reach_ns(), 1.0)
            return None
        now, n, mine, queued = entries[-1].start_ns, 0, 0, 0
        if now < self.next_gpu_test_ns:
            return None
        self.next_gpu_test_ns = now + step // 4
        draws = iter(DRAWS)
        want = next(draws)
        for e in reversed(entries):
            if now - e.start_ns >= want * step:
                if want == DRAWS[0] and not (n and mine >= cfg.ratio * n):
                    return None  # not last in most of the latest steps (see decide)
                if n and mine >= cfg.ratio * n and queued * 2 > mine:
                    p = binomial_tail(math.floor(mine / n * want), want, 1.0 / self.nranks)
                    if p < cfg.false_alarm_p:
                        return Decision("draws", want, n, now - e.start_ns, p)
                want = next(draws, 0)
                if not want:
                    return None
            if e.gpu_timed:
                n += 1
                mine += e.gpu_rank == rank
                queued += e.gpu_rank == rank and e.gpu_cause == "gpu_queue"
        return None

    def gpu_share(self, rank: int, steps: int = 0) -> float:
        """``rank``'s share of the GPU-timed collectives whose kernel it started last: over the latest ``steps``
        steps, CLEAR_STEPS at least, or the whole window (0, or the step unknown)."""
        n = self.latest(max(steps, CLEAR_STEPS) if steps else 0)
        if n == len(self.entries):
            return self.gpu_counts.get(rank, 0) / self.gpu_timed if self.gpu_timed else 0.0
        timed = [e for e in list(self.entries)[-n:] if e.gpu_timed]
        return sum(1 for e in timed if e.gpu_rank == rank) / len(timed) if timed else 0.0

    def queued(self, rank: int) -> int:
        """Entries whose kernel ``rank`` started last with its stream still busy (cause gpu_queue)."""
        return sum(1 for e in self.entries if e.gpu_rank == rank and e.gpu_cause == "gpu_queue")

    def _pop(self) -> None:
        old = self.entries.popleft()
        if self.by_seq.get(old.seq) is old:
            del self.by_seq[old.seq]
        _take(self.counts, old.rank)
        if old.gpu_timed:
            self.gpu_timed -= 1
            _take(self.gpu_counts, old.gpu_rank)


def _take(counts: dict[int, int], rank: int | None) -> None:
    """One fewer for ``rank`` (nothing for None); a rank at 0 leaves the dict."""
    if rank is None:
        return
    left = counts[rank] - 1
    if left:
        counts[rank] = left
    else:
        del counts[rank]
