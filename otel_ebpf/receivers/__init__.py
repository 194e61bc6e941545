"""Receivers: one folder per component, listed by hand in otel_ebpf.service.components.

Installed as ``otel_ebpf.receivers`` (see setup.py). Imported under any other name (e.g. as a
top-level ``receivers`` because the repository root is on sys.path) its modules would load twice
and isinstance checks would fail between the copies, so that is refused.
"""
if __name__ != "otel_ebpf.receivers":
    raise ImportError(f"import this package as otel_ebpf.receivers, not {__name__}")
