"""The registries: every component type, listed by hand (nothing registers itself on import).

After the OTel Collector's ``components.go``. Adding a component means adding one line here.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

__all__ = ["processors", "receivers"]


def receivers() -> dict[str, Factory]:
    from otel_ebpf.receivers import cuda, nccl, nvml
    from otel_ebpf.receivers import blockio, memory, perf
    from otel_ebpf.receivers import lifecycle, sched
    from otel_ebpf.receivers import python as python_receiver, torch as torch_receiver
    from otel_ebpf.receivers import apptrace, probes

    return {f.type: f for f in (cuda.factory, nccl.factory, nvml.factory,
                                blockio.factory, memory.factory, perf.factory,
                                lifecycle.factory, sched.factory, python_receiver.factory,
                                torch_receiver.factory, probes.factory, apptrace.factory)}


def processors() -> dict[str, Factory]:
    from otel_ebpf.processors import cuda, nccl, nccl_watch
    from otel_ebpf.processors import blockio, memory, perf
    from otel_ebpf.processors import lifecycle, sched
    from otel_ebpf.processors import python as python_processor, torch as torch_processor
    from otel_ebpf.processors import apptrace as apptrace_processor, probes as probes_processor

    # nccl_watch right after nccl: it reads the nccl processor's call spans (the default pipeline keeps this order)
    return {f.type: f for f in (cuda.factory, nccl.factory, nccl_watch.factory,
                                blockio.factory, memory.factory, perf.factory,
                                lifecycle.factory, sched.factory, python_processor.factory,
                                torch_processor.factory, probes_processor.factory, apptrace_processor.factory)}
