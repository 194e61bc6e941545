"""The emit stage: the only package that touches the OTel SDK (STYLE.md, "Layers").

Nothing is re-exported here, so importing one module loads only what it needs; import the module:

* :mod:`.emitter` - records -> SDK spans and metrics, one ``Resource`` per traced process
  (:mod:`.spans` builds the spans, :mod:`.process_meters` holds each process's metrics).
* :mod:`.exporters` - the ``exporters:`` config section and the SDK exporters it builds.
* :mod:`.sending` - each exporter's own bounded sending queue (worker thread, batching, retries).
* :mod:`.forward` - the gateway's emit stage (spans and metrics received over OTLP).
* :mod:`.otlp_in` - decoded OTLP requests -> SDK objects (the gateway's ingest).
* :mod:`.jsonfile`, :mod:`.prometheus` - OTLP JSON lines files, the Prometheus endpoint.
* :mod:`.histograms` - weighted histograms.

This file exists so that the package ships: setuptools' ``find_packages`` skips folders without
one, and the wheel had no ``otel_ebpf.emit`` (tests/e2e/test_wheel.py).
"""
