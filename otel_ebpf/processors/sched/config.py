"""Configuration of the sched processor (``processors: {sched: {...}}``).

It has no keys: ``process_spans``, ``max_processes`` and ``max_execs`` moved to
``processors.lifecycle`` with the process spans; an old config that sets them under
``processors.sched`` is refused as an unknown key (docs/receivers.md).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Config"]


@dataclass
class Config:
    """No settings (see the module docstring)."""

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
