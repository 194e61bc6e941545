"""otel-ebpf: eBPF + NVML to OpenTelemetry for AI/ML jobs."""
__version__ = "0.1.0"
