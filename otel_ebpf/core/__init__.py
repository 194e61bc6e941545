"""The core every other layer builds on: the pipeline (Consumer, BoundedQueue, Context), event
records, self-telemetry counters, errors, the processor base, derived ids and the config model.
Imports nothing else of otel_ebpf.
"""
