"""Fuzzing the gateway's C decoder of OTLP trace requests (otel_ebpf.emit._otlpdec) with bytes from the network.

Contract checked: any bytes, valid or not, give a result or None, never a crash or an exception; bytes the protobuf
parser accepts and the decoder does not hand back decode to exactly the spans and drops otlp_in's Python path makes
of the parsed request. Inputs: a valid request with bytes flipped, cut, inserted or duplicated, and raw random
bytes.
"""
from __future__ import annotations

import logging
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_ebpf.emit import otlp_in
from tests.unit.emit.test_otlp_json import direct_spans, traced_spans
from tests.unit.emit.test_otlpdec import opened

VALID = encode_spans([s for s in [*traced_spans(), *direct_spans()]
                      if not s.get_span_context().trace_state][:6]).SerializeToString()


def decode(data: bytes) -> Any:
    from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]

    return _otlpdec.decode_spans(data)


def check(data: bytes) -> None:
    logging.disable(logging.CRITICAL)  # the SDK warns about odd attribute values: not what is checked
    try:
        got = decode(data)
        try:
            request = ExportTraceServiceRequest.FromString(data)
        except Exception:  # the OTLP server refuses such a body before the gateway decodes it
            return
        if got is None:
            return
        spans, bad_spans, bad_links = got
        ref, drops = otlp_in._spans_in_python(request)
        assert [opened(s) for s in spans] == [opened(s) for s in ref]
        assert (bad_spans, bad_links) == (drops.get("malformed_span", 0), drops.get("malformed_link", 0))
    finally:
        logging.disable(logging.NOTSET)


edits = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "repeat"]), st.integers(0, len(VALID) - 1),
                           st.integers(0, 255)), min_size=1, max_size=4)


@settings(max_examples=1500, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits)
def test_a_mangled_request_decodes_as_python_converts_it_or_is_handed_back(changes):
    data = bytearray(VALID)
    for op, at, byte in changes:
        if not data:
            break
        at %= len(data)
        if op == "flip":
            data[at] ^= byte or 1
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data.insert(at, byte)
        else:
            data[at:at] = data[at:at + byte % 32]
    check(bytes(data))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_it(data: bytes):
    check(data)
