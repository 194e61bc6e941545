"""Processors: one folder per processor, listed by hand in otel_ebpf.components."""
