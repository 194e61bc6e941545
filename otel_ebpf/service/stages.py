"""The stages of the agent's pipelines (emitter and processors), built apart from its queues and receivers.

Building them imports the OTel SDK and the exporters (~0.2 s here) and makes the exporters (a Prometheus
exporter listens from then on). ``run -- CMD`` with a deferred start builds them on a thread of their own
(:class:`Builder`) while its first BPF program compiles (issue 18: the command waits for that compile, and
clang runs in C with the GIL released), and connects them to the queues once both are done; the receivers'
records wait in the bounded queues meanwhile. BCC changes the working directory while it compiles: nothing built
here may resolve a relative path, which is why the file exporter's directory is made absolute when its config is
validated (otel_ebpf.emit.exporter_config).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_ebpf.core.pipeline import BoundedQueue, Consumer, Context
from otel_ebpf.host.processes import ResourceCache
from otel_ebpf.service import components
from otel_ebpf.service.settings import AgentConfig

__all__ = ["Builder", "Pipeline", "build_pipelines"]


@dataclass
class Pipeline:
    name: str
    emitter: Any  # otel_ebpf.emit.emitter.Emitter
    processors: list[Any]
    queue: BoundedQueue


def build_pipelines(cfg: AgentConfig, ctx: Context, resources: ResourceCache,
                    queues: Mapping[str, BoundedQueue]) -> list[Pipeline]:
    """Each pipeline's emitter (with its exporters) and processors, connected to its queue in ``queues``."""
    from otel_ebpf.emit.emitter import Emitter, ExporterSpec
    from otel_ebpf.emit.exporters import build_exporters, build_log_exporter
    from otel_ebpf.host.identity import agent_resource_attributes

    svc = cfg.service
    factories = components.processors()
    out: list[Pipeline] = []
    for name, p in svc.pipelines.items():
        specs = []
        for eid in p.exporters:
            ecfg = cfg.exporters[eid]
            spans, metrics = build_exporters(ecfg)
            specs.append(ExporterSpec.of(eid, spans, metrics, ecfg, logs=build_log_exporter(ecfg)))
        emitter = Emitter(specs, ctx.telemetry, resource_of=lambda pid, comm: resources.get(pid, comm),
                          agent_attributes=agent_resource_attributes(), extra_attributes=svc.resource_attributes,
                          max_processes=svc.max_processes, metrics_interval=svc.metrics_interval,
                          metrics_warmup=svc.metrics_warmup)
        resources.subscribe(emitter.resource_changed)  # resources follow exec (issue 18)
        nxt: Consumer = emitter
        procs: list[Any] = []
        for proc_id in reversed(p.processors):
            proc = factories[proc_id.split("/")[0]].create(cfg.processors[proc_id], ctx, nxt)
            procs.insert(0, proc)
            nxt = proc
        queues[name].connect(nxt)
        out.append(Pipeline(name, emitter, procs, queues[name]))
    return out


class Builder:
    """``build()`` on a thread of its own; :meth:`result` waits for it and returns what it built, or raises
    what it raised."""

    def __init__(self, build: Callable[[], list[Pipeline]]) -> None:
        self._build = build
        self._result: list[Pipeline] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="otel-ebpf-build-stages", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._build()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> list[Pipeline]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result
