"""Moved: the gateway's OTLP receiver is the ``otlp`` component of :mod:`otel_ebpf.receivers.otlp`
(its ``Config`` was ``OtlpReceiverConfig``), the SDK-side conversion of what it receives is
:mod:`otel_ebpf.gateway.ingest`. This name stays only for :mod:`otel_ebpf.gateway.config`,
which imports ``OtlpReceiverConfig`` from here."""
from __future__ import annotations

from otel_ebpf.receivers.otlp import Config as OtlpReceiverConfig

__all__ = ["OtlpReceiverConfig"]
