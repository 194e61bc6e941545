"""otel_ebpf.emit.otlp_proto: the direct OTLP protobuf encoder writes the bytes the SDK's encoder + protobuf write.

The reference is what the SDK's OTLP exporters send, ``encode_spans(spans).SerializeToString()``
(and ``encode_logs``): every comparison here is of the two byte strings. The spans and records
are those of test_otlp_json (SDK-traced and built directly, every value kind, limits, NaN).
"""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.emit import otlp_proto
from otel_ebpf.emit.otlp_json import Unencodable
from otel_ebpf.emit.otlp_proto import logs_to_otlp_proto, spans_to_otlp_proto
from tests.unit.emit.test_otlp_json import (
    REFUSED,
    REFUSED_IDS,
    direct_span,
    direct_spans,
    exactly_encodable,
    generated_spans,
    log_records,
    resources,
    traced_spans,
)


def sdk_bytes(spans: list[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()


def sdk_log_bytes(records: list[ReadableLogRecord]) -> bytes:
    return encode_logs(records).SerializeToString()


def test_spans_are_written_byte_for_byte_as_the_sdk_encodes_them():
    spans = traced_spans() + direct_spans()
    assert spans_to_otlp_proto(spans) == sdk_bytes(spans)
    for span in spans:  # and each alone: its own resource and scope blocks
        assert spans_to_otlp_proto([span]) == sdk_bytes([span])


def test_the_bytes_parse_back_with_the_proto_classes_and_hold_every_case():
    spans = traced_spans() + direct_spans()
    request = ExportTraceServiceRequest.FromString(spans_to_otlp_proto(spans))
    assert len(request.resource_spans) == 3  # 4 resources, two of them equal
    all_spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(all_spans) == len(spans)
    assert {s.flags for s in all_spans} == {256, 768} and {s.status.code for s in all_spans} == {0, 1, 2}
    kinds = {kv.value.WhichOneof("value") for s in all_spans for kv in s.attributes}
    assert kinds == {"string_value", "bool_value", "int_value", "double_value", "array_value", "bytes_value",
                     "kvlist_value", None}
    assert any(lk.flags == 768 for s in all_spans for lk in s.links)


def test_long_fields_take_multi_byte_lengths_alike():
    res = resources()[0]
    spans = [direct_span("n" * 300, {"k" * 200: "v" * 70_000, "i": 2**40, "neg": -5, "u": "é" * 100,
                                     "a": tuple(range(200))}, resource=res, scope=None)] * 3
    assert spans_to_otlp_proto(spans) == sdk_bytes(spans)


def test_more_distinct_keys_than_the_key_cache_holds_are_written_alike():
    attributes = {f"key.{i}": i for i in range(5000)}
    spans = [direct_span("many", attributes, resource=resources()[0], scope=None)] * 2
    assert spans_to_otlp_proto(spans) == sdk_bytes(spans)
    assert len(otlp_proto._HEADS) <= otlp_proto._HEADS_MAX


def test_an_empty_batch_is_the_empty_request():
    assert spans_to_otlp_proto([]) == sdk_bytes([]) == b""
    assert logs_to_otlp_proto([]) == sdk_log_bytes([]) == b""


@pytest.mark.parametrize("value", REFUSED, ids=REFUSED_IDS)
def test_a_value_it_cannot_write_exactly_is_refused(value: Any):
    res = resources()
    good = direct_span("good", {"a": 1}, resource=res[0], scope=None)
    bad = direct_span("bad", {"ok": 1, "refused": value}, resource=res[0], scope=None)
    with pytest.raises(Unencodable):
        spans_to_otlp_proto([good, bad])


def test_log_records_are_written_byte_for_byte_as_the_sdk_encodes_them():
    records = log_records()
    assert logs_to_otlp_proto(records) == sdk_log_bytes(records)
    for record in records:
        assert logs_to_otlp_proto([record]) == sdk_log_bytes([record])
    parsed = ExportLogsServiceRequest.FromString(logs_to_otlp_proto(records))
    assert len(parsed.resource_logs) == 3


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_spans())
def test_generated_spans_are_written_as_the_sdk_encodes_them_or_refused(spans):
    if exactly_encodable(spans):
        assert spans_to_otlp_proto(spans) == sdk_bytes(spans)
    else:
        with pytest.raises(Unencodable):
            spans_to_otlp_proto(spans)
