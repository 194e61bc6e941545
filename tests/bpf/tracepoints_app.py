"""A small application instrumented with the OTel SDK and otel_ebpf.tracepoints, driven by
tests/bpf/test_tracepoints_sdk.py: ``python tracepoints_app.py LIBCUDART OUT.json``.

Prints ``ready pid=N enabled=B``, waits for a line on stdin, then inside an OTel request span
fires a point probe and opens ``tp.span("batch")`` around real libcudart calls (error 35
without a GPU; the probes fire anyway) and an app span of its own. Writes its finished spans
(name, trace_id, span_id, parent) and the probe states it saw to OUT.json.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ebpf import tracepoints
def main() -> int:
    cudart_path, out_path = sys.argv[1], sys.argv[2]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tracepoints-app")
    tp = tracepoints.Provider("testapp")
    loaded = tp.probe("model_loaded", model=str, version=int)
    print(f"ready pid={os.getpid()} enabled={loaded.enabled}", flush=True)
    sys.stdin.readline()
    state = {"enabled": loaded.enabled, "available": tracepoints.AVAILABLE}
    rcs = []
    with tracer.start_as_current_span("request"):
        loaded.fire(model="resnet50", version=lambda: 3)
        with tp.span("batch", size=4):
            cudart = ctypes.CDLL(cudart_path)
            ptr = ctypes.c_void_p()
            rcs.append(cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))
            buf = ctypes.create_string_buffer(4096)
            rcs.append(cudart.cudaMemcpy(buf, buf, ctypes.c_size_t(4096), 1))
            with tracer.start_as_current_span("inner"):
                pass
        rcs.append(cudart.cudaMemcpy(buf, buf, ctypes.c_size_t(64), 1))  # after the batch span
    spans = [{"name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
              "parent": s.parent.span_id if s.parent else 0} for s in exporter.get_finished_spans()]
    with open(out_path, "w") as fh:
        json.dump({"spans": spans, "rcs": rcs, "stats": tracepoints.stats, **state}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
