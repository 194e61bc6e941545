"""Configuration of the collective join (gateway ``processors: {collective_join: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc, key_path
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config", "StragglerConfig"]


@dataclass
class StragglerConfig:
    """Persistent stragglers (:mod:`.stragglers`); defaults measured in docs/collectives.md."""

    enabled: bool = doc(True, "Name a rank that is last to arrive in most recent complete collectives of a "
                              "communicator: an otel_ebpf.nccl.straggler log record, the nccl.straggler.persistent "
                              "gauge and a warning, and the same (state cleared) when it recovers.")
    window: int = doc(
        50, "The window holds at least this many of the communicator's latest complete collectives (grouped "
            "send/recv, partial and evicted ones are not counted; at most 8 of a step once the steps are known). "
            "While the ranks' lateness never moved (no steps to find), a rank is named when it is last in ratio of "
            "at least this many over min_span.", min=2)
    min_span: float = doc(
        10.0, "The window reaches back at least this far (collective start times), and 64 of the job's steps once "
              "it knows them. While the ranks' lateness never moved (ranks in lock-step, one of them late by the "
              "same amount every time), the window rule names a rank last in ratio of at least `window` "
              "collectives over this long: in a job with any noise the lateness moves within seconds, and until "
              "the steps are known nobody is named (the window rule named ranks on noise alone in jobs of long "
              "steps).", duration=True)
    strong_lead_factor: float = doc(
        2.0, "A last rank's lead (time ahead of the next-to-last) is strong when it is at least this many times the "
             "communicator's usual lead (the median of its last 256 collectives). A rank that is the strong last in "
             "most of a few steps is late by more than the job's own noise explains, and is named in a few steps "
             "rather than a dozen (docs/collectives.md). 0: only the share of last arrivals counts.", min=0.0)
    false_alarm_p: float = doc(
        1e-5, "A rank is named when, with nobody slowed, being last (or the strong last) in its share of the latest "
              "steps would be less likely than this (a binomial tail over the steps, which the window finds as the "
              "times the ranks' lateness is drawn anew). Smaller: fewer false alarms, later detection.", min=0.0,
        max=0.01)
    max_window: int = doc(
        512, "Most collectives a window holds (per communicator, however many min_span would take); with "
             "max_comms it bounds memory: each entry keeps its collective's straggler figures (~1 KiB).", min=2)
    ratio: float = doc(
        0.8, "A rank is named only when it is the last to arrive in at least this share of the collectives of the "
             "steps tested (above 0; a share above 0.5 names at most one rank), and false_alarm_p says it is no "
             "chance.", max=1.0)
    clear_ratio: float = doc(
        0.5, "It is cleared when its share falls below this (hysteresis: no event per collective around ratio).",
        min=0.0, max=1.0)
    min_lead: float = doc(
        0.001, "A collective counts as someone's only when its last rank started at least this much after the "
               "next-to-last (the time the job waited for that rank alone); closer ones count for nobody. Above "
               "Python's enqueue jitter (10-100 us) and LAN NTP offsets between nodes (docs/collectives.md), "
               "below 5 % of a 60 ms step.", duration=True)
    idle_timeout: float = doc(
        120.0, "A communicator with no complete collective for this long is forgotten; a rank named on it is "
               "cleared (reason idle), so a finished job does not leave the gauge at 1.", duration=True, min=0.001)
    max_comms: int = doc(
        1024, "Communicators followed at once; beyond it the least recently active is forgotten (cleared, "
              "reason evicted) and counted in nccl.straggler.comms.evicted.", min=1)

    def validate(self, path: str) -> None:
        if self.ratio <= 0:
            raise ConfigError(key_path(path, "ratio"), f"must be > 0 and <= 1, got {self.ratio}")
        if self.clear_ratio >= self.ratio:
            raise ConfigError(key_path(path, "clear_ratio"), f"must be below ratio ({self.ratio})")
        if self.max_window < self.window:
            raise ConfigError(key_path(path, "max_window"), f"must be >= window ({self.window})")


@dataclass
class Config:
    """Every default lives here and is documented here."""

    timeout: float = doc(
        5.0, "How long a collective waits for all nccl.nranks rank spans after its first span arrived. "
             "Then it is released as partial: nccl.partial=true and nccl.missing_ranks on its root span.",
        duration=True)
    desync_timeout: float = doc(
        0.0, "How long a collective may wait with ranks missing before the hang is reported while it "
             "lasts: a nccl.desync event on the root span, the nccl.desync.count metric and a warning "
             "naming the missing ranks and every rank's last sequence number. 0 means the same as "
             "timeout; it cannot be longer.", duration=True)
    max_pending: int = doc(
        100_000, "Collectives waiting for ranks at once; beyond it the oldest is released early as "
                 "partial and counted (nccl.join.released{outcome=evicted}). As many released "
                 "collectives are remembered, to recognise late spans.", min=1)
    max_spans: int = doc(
        250_000, "Rank spans held by waiting collectives in all (~1.3 KiB each as received, with 13 attributes "
                 "and the bytes it is sent on as: 250k is about 310 MiB); beyond it the oldest collectives are "
                 "released early as with max_pending. Also bounds the wavefront entries.", min=1)
    max_comms: int = doc(
        4096, "Communicators whose wavefront (each rank's highest nccl.seq) is kept for desync reports; "
              "beyond it the least recently active is forgotten.", min=1)
    max_stacks: int = doc(
        1024, "Silent ranks' stacks (the agents' otel_ebpf.nccl.rank.stack log records) kept, the latest per "
              "(communicator, rank), for the desync reports of their hangs; least recently received out, counted in "
              "otel_ebpf.collective_join.unjoined{reason=stack_evicted}. Each keeps at most 16 KiB of stack text.",
        min=1)
    stack_max_age: float = doc(
        600.0, "A stack names what a missing rank is doing for this long after it arrived (and only while the rank "
               "made no NCCL call since); a hang's desync report is updated with stacks that come later for as "
               "long.", duration=True, min=0.001)
    max_ranks: int = doc(
        65536, "Largest nccl.nranks accepted; spans claiming more (or a rank outside 0..nranks-1) are "
               "passed through unjoined and counted in otel_ebpf.collective_join.unjoined{reason=bad_rank}.", min=1)

    persistent_straggler: StragglerConfig = doc(
        StragglerConfig(), "Persistent stragglers: a rank last to arrive in most recent collectives of a "
                           "communicator, named once and cleared when it recovers.")

    @property
    def effective_desync_timeout(self) -> float:
        return self.desync_timeout or self.timeout

    def validate(self, path: str) -> None:
        if self.timeout <= 0:
            raise ConfigError(key_path(path, "timeout"), "must be > 0")
        if self.desync_timeout > self.timeout:
            raise ConfigError(key_path(path, "desync_timeout"), f"must not exceed timeout ({self.timeout}s): a "
                                                                "collective is released (as partial) at timeout")
