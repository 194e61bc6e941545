"""Python processor: Python calls (otel_ebpf/receivers/python) to nested spans (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.ids import call_ids
from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import PythonProcessor, qualified_name

__all__ = ["Config", "PythonProcessor", "call_ids", "create", "factory", "qualified_name"]


def create(config: Config, ctx: Context, next_: Consumer) -> PythonProcessor:
    return PythonProcessor(config, ctx, next_)


factory = Factory(type="python", config_class=Config, create=create,
                  description="Python calls to spans (code.function.name, code.file.path, code.line.number), "
                              "nested by derived ids", default_on=False)
