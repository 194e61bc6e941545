"""The collective join's metric table (name -> kind, unit, description) and the rank-range text of
its warnings; the counters are summed per batch (otel_ebpf.core.processing.EventProcessor.sums)."""
from __future__ import annotations

from collections.abc import Sequence

from otel_ebpf.core.processing import MetricSpec

__all__ = ["METRICS", "ranges_text"]

METRICS: dict[str, MetricSpec] = {
    "nccl.straggler.count": ("counter", "{collective}", "Complete collectives in which this rank started last."),
    "nccl.straggler.persistent": ("gauge", "1", "1 while this rank is a persistent straggler of this communicator "
                                  "(last to arrive in at least persistent_straggler.ratio of its recent complete "
                                  "collectives), 0 once cleared."),
    "nccl.straggler.comms.evicted": ("counter", "{communicator}", "Communicators whose persistent-straggler window "
                                     "was forgotten to stay within persistent_straggler.max_comms."),
    "nccl.desync.count": ("counter", "{collective}",
                          "Collectives reported as hung: ranks missing after desync_timeout."),
    "nccl.join.released": ("counter", "{collective}", "Collectives released by the join, by outcome."),
    "nccl.join.p2p.released": ("counter", "{instance}", "Grouped send/recv instances released, by outcome."),
    "nccl.join.gpu.released": ("counter", "{collective}", "Collectives whose GPU span the join released, by outcome "
                               "(complete: every rank's GPU span arrived)."),
    "nccl.join.late": ("counter", "{span}", "Spans that arrived after their collective was released."),
    "nccl.collective.skew": ("histogram", "s", "First to last rank arrival (start) of each collective."),
}


def ranges_text(ranks: Sequence[int], limit: int = 32) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (at most ``limit`` runs, then '...')."""
    runs: list[str] = []
    i = 0
    while i < len(ranks) and len(runs) < limit:
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        runs.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(runs) + (",..." if i < len(ranks) else "")
