"""Lifecycle processor: lifecycle receiver events -> one ``process`` span per traced process,
its command line redacted (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import LifecycleProcessor

__all__ = ["Config", "LifecycleProcessor", "factory"]


factory = Factory(type="lifecycle", config_class=Config, create=LifecycleProcessor,
                  description="Fork/exec/exit events to one span per traced process, with its redacted "
                              "command line, exec events and exit code")
