from otel_ebpf.cli import entry

entry()
