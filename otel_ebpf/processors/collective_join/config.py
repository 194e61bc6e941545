"""Configuration of the collective join (gateway ``processors: {collective_join: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc, key_path
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


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
        250_000, "Rank spans held by waiting collectives in all (~1.2 KiB each as received: 250k is about "
                 "300 MiB); beyond it the oldest collectives are released early as with max_pending. Also "
                 "bounds the wavefront entries.", min=1)
    max_comms: int = doc(
        4096, "Communicators whose wavefront (each rank's highest nccl.seq) is kept for desync reports; "
              "beyond it the least recently active is forgotten.", min=1)
    max_ranks: int = doc(
        65536, "Largest nccl.nranks accepted; spans claiming more (or a rank outside 0..nranks-1) are "
               "passed through unjoined and counted in otel_ebpf.collective_join.unjoined{reason=bad_rank}.", min=1)

    @property
    def effective_desync_timeout(self) -> float:
        return self.desync_timeout or self.timeout

    def validate(self, path: str) -> None:
        if self.timeout <= 0:
            raise ConfigError(key_path(path, "timeout"), "must be > 0")
        if self.desync_timeout > self.timeout:
            raise ConfigError(key_path(path, "desync_timeout"), f"must not exceed timeout ({self.timeout}s): a "
                                                                "collective is released (as partial) at timeout")
