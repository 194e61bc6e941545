"""The package version, importable from any layer (``otel_ebpf.__version__`` re-exports it)."""
__version__ = "0.1.0"
