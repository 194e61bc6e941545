"""Configuration of the NCCL processor (``processors: {nccl: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    max_comms: int = doc(
        4096, "Communicators remembered at once (over all processes), and as many per-process "
              "id counters. Beyond it a new communicator is not remembered (counted as "
              "otel_ebpf.events.dropped{receiver=nccl, reason=comm_table_full}) and its calls "
              "are emitted without cross-rank join ids.", min=1)
    max_held_calls: int = doc(
        4096, "Calls on split communicators held (over all processes) while this agent waits for "
              "the last parent rank's ncclCommSplit to compute their rank and size. Beyond it the "
              "oldest are emitted without nccl.rank (counted as otel_ebpf.nccl.unjoined"
              "{reason=split_unresolved}; the gateway's join can still resolve them). Also bounds, "
              "separately, the calls made inside NCCL groups held until the group's end says whether "
              "ncclGroupSimulateEnd closed it (beyond: not held, counted as "
              "otel_ebpf.events.dropped{reason=group_calls_full}).", min=0)
    split_wait: float = doc(
        5.0, "How long (event time) a call on a split communicator is held at most for its "
             "split's last rank, and a call inside a group for the group's end (see max_held_calls).",
        duration=True, min=0.0)
    host: str = doc(
        "", "Host name used in the ids of ncclCommInitAll communicators (all their ranks live "
            "in one process, so the id only has to be unique); empty means this host's name.")
    root_spans: bool = doc(
        True, "Emit, from the process that is rank 0, one root span per collective (span id = "
              "the parent id every rank's span points to), so traces render without a missing "
              "parent.")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
