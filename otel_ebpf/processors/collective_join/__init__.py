"""Collective join (gateway processor): every rank's span of one NCCL collective, from any
number of nodes, joined into one trace with one root; stragglers, skew, partial and
mismatched collectives named, hangs reported while they last.

Type name ``collective_join``; :class:`Config` in :mod:`.config`; bounded state in :mod:`.store`.
Listed in the gateway's registry (``otel_ebpf.gateway.components``), not the agent's.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import CollectiveJoin, create

__all__ = ["CollectiveJoin", "Config", "factory"]

factory = Factory(type="collective_join", config_class=Config, create=create,
                  description="join NCCL rank spans across ranks and nodes into one trace per collective")
