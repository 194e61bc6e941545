"""Python receiver: the interpreter's USDT probes (python:function__entry/return) -> typed
:class:`~.events.PythonCall` events, paired and filtered (min duration, file path prefixes) in
the kernel. Every Python call traps while attached (about a microsecond or two), so it is off
by default: enable it by naming it in ``service.pipelines``. The ``python`` processor turns
the events into spans.
"""
from __future__ import annotations

from pathlib import Path

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import PythonReceiver
from otel_ebpf.bpf.python_usdt import NoUsdtError

__all__ = ["HOOK_DIR", "Config", "NoUsdtError", "PythonReceiver", "create", "factory"]

#: the folder whose sitecustomize.py sets a do-nothing profile function (config ``profile_hook``)
HOOK_DIR = Path(__file__).resolve().with_name("hook")


def create(config: Config, ctx: Context, next_: Consumer) -> PythonReceiver:
    return PythonReceiver(config, ctx, next_)


factory = Factory(type="python", config_class=Config, create=create,
                  description="Python function calls (interpreter USDT probes), filtered in the kernel by "
                              "duration and file path", default_on=False)
