"""Receivers: one folder per receiver, listed by hand in otel_ebpf.components."""
