"""otel_ebpf.emit._otlpdec (C): the spans it decodes from a request's bytes are the ones otlp_in's Python path makes
of the parsed request, field for field; what it does not decode, it hands back (None) and Python converts.

The reference is ``otlp_in._spans_in_python`` on the same request (the conversion tests/unit/emit/test_otlp_in.py
checks against the SDK). Compared: every instance field of every span (contexts as tuples, events, links and
statuses opened up, the kept Span message parsed), the resources and scopes (their attributes, versions, schema
URLs, and which spans share one object), and the drops.
"""
from __future__ import annotations

from typing import Any

import pytest

from hypothesis import HealthCheck, given, settings
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceState

from otel_ebpf.emit import otlp_in
from otel_ebpf.emit.otlp_common import RECEIVED_SPAN
from tests.unit.emit.test_otlp_json import direct_span, direct_spans, exactly_encodable, generated_spans, resources
from tests.unit.emit.test_otlp_json import traced_spans


def decode(request: ExportTraceServiceRequest) -> Any:
    from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]

    return _otlpdec.decode_spans(request.SerializeToString())


def canon(value: Any) -> Any:
    """``value`` with each NaN as a marker (two NaN objects are not equal) and containers opened."""
    if isinstance(value, float) and value != value:
        return "<NaN>"
    if isinstance(value, tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    return value


def opened(span: ReadableSpan) -> dict[str, Any]:
    out = dict(vars(span))
    out["_attributes"] = canon(span._attributes)
    out["_context"] = (type(span._context), tuple(span._context))
    out["_parent"] = None if span._parent is None else (type(span._parent), tuple(span._parent))
    out["_events"] = (type(span._events), [(type(e), canon(vars(e))) for e in span._events])
    out["_links"] = (type(span._links), [(type(lk), lk.context, canon(lk.attributes)) for lk in span._links])
    out["_status"] = (type(span._status), span._status.status_code, span._status.description)
    res, scope = span._resource, span._instrumentation_scope
    out["_resource"] = (type(res), dict(res.attributes), res.schema_url)
    if RECEIVED_SPAN in out:  # the bytes as received (C) or as protobuf serializes the parsed span (Python): the
        out[RECEIVED_SPAN] = Span.FromString(out[RECEIVED_SPAN])  # same message, not always the same bytes
    out["_instrumentation_scope"] = None if scope is None else (
        type(scope), scope.name, scope.version, scope.schema_url,
        dict(scope.attributes) if scope.attributes is not None else None)
    return out


def sharing(spans: list[ReadableSpan]) -> list[tuple[int, int]]:
    """For each span, the index of the first span with the same resource object and with the same scope object."""
    first_res: dict[int, int] = {}
    first_scope: dict[int, int] = {}
    return [(first_res.setdefault(id(s.resource), i), first_scope.setdefault(id(s.instrumentation_scope), i))
            for i, s in enumerate(spans)]


def same_as_python(request: ExportTraceServiceRequest) -> None:
    got = decode(request)
    assert got is not None, "the C decoder handed the request back"
    spans, bad_spans, bad_links = got
    ref, drops = otlp_in._spans_in_python(request)
    assert [opened(s) for s in spans] == [opened(s) for s in ref]
    assert sharing(spans) == sharing(ref)
    assert (bad_spans, bad_links) == (drops.get("malformed_span", 0), drops.get("malformed_link", 0))
    assert otlp_in.spans_from_request(request)[1] == drops


def test_the_extension_is_built_and_used():
    assert otlp_in.NATIVE, "otel_ebpf.emit._otlpdec did not build (pip install -e . builds it; needs gcc)"


def test_sdk_made_and_directly_built_spans_decode_as_python_converts_them():
    """Parents local and remote, the five kinds, statuses with messages, events, links, every value kind (arrays,
    bytes, kvlists as dicts), non-ASCII, 4 resources (two equal), scopes with versions, attributes, schema URLs."""
    spans = [s for s in [*traced_spans(), *direct_spans()] if not s.get_span_context().trace_state]
    assert len(spans) > 10
    same_as_python(encode_spans(spans))


def test_ids_that_are_not_16_and_8_non_zero_bytes_drop_the_span_or_link_and_are_counted():
    request = encode_spans([direct_span(f"s{i}", {"i": i}, resource=resources()[0], scope=None, span_id=i + 1)
                            for i in range(3)])
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x00" * 8
    spans[1].links.add(trace_id=b"\x01" * 3, span_id=b"\x02" * 8)
    spans[1].links.add(trace_id=b"\x01" * 16, span_id=b"\x00" * 8)
    spans[2].parent_span_id = b"\x01\x02"
    spans.add(trace_id=b"\x05" * 17, span_id=b"\x02" * 8, name="long trace id")
    spans.add(trace_id=b"\x05" * 16, span_id=b"\x02" * 8, name="kept", kind=9, flags=0x300,
              parent_span_id=b"\x07" * 8).status.code = 7
    same_as_python(request)
    assert decode(request)[1:] == (3, 2)


def test_values_python_would_make_of_odd_input_are_made_alike():
    """Kinds and status codes out of range, an attribute without a value, an empty key, kvlists, nested arrays, an
    event at time 0, a span without a name or times, a resource without attributes."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.schema_url = "https://example/schema"
    ss = rs.scope_spans.add()
    ss.scope.name = "s"
    span = ss.spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, kind=-3)
    span.attributes.append(KeyValue(key="none"))
    span.attributes.append(KeyValue(key="", value=AnyValue(string_value="")))
    kv = span.attributes.add(key="kv")
    kv.value.kvlist_value.values.add(key="a").value.array_value.values.add().array_value.values.add(int_value=-5)
    span.attributes.add(key="dup", value=AnyValue(int_value=1))
    span.attributes.add(key="dup", value=AnyValue(double_value=2.5))
    span.events.add(name="", time_unix_nano=0)
    span.status.code = 2
    ss.spans.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8).status.message = "not an error: dropped"
    request.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x03" * 16, span_id=b"\x05" * 8)
    same_as_python(request)


@pytest.mark.parametrize("case", ["span trace state", "link trace state", "deep"])
def test_what_it_does_not_decode_it_hands_back_and_python_converts(case: str):
    res = resources()[0]
    span = direct_span("x", {}, resource=res, scope=None)
    if case == "span trace state":
        span = direct_span("x", {}, resource=res, scope=None, trace_state=TraceState([("k", "v")]))
    request = encode_spans([span])
    pb = request.resource_spans[0].scope_spans[0].spans[0]
    if case == "link trace state":
        pb.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, trace_state="k=v")
    if case == "deep":
        value = pb.attributes.add(key="deep").value
        for _ in range(40):
            value = value.array_value.values.add()
        value.int_value = 1
    assert decode(request) is None
    spans, drops = otlp_in.spans_from_request(request)
    ref, ref_drops = otlp_in._spans_in_python(request)
    assert [opened(s) for s in spans] == [opened(s) for s in ref] and drops == ref_drops


def test_truncated_bytes_are_handed_back():
    data = encode_spans(traced_spans()[:3]).SerializeToString()
    from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]

    for cut in (1, 7, len(data) // 2, len(data) - 1):
        assert _otlpdec.decode_spans(data[:cut]) is None
    assert _otlpdec.decode_spans(b"") == ([], 0, 0)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_spans())
def test_generated_spans_decode_as_python_converts_them(spans):
    if exactly_encodable(spans) and all(s.context.span_id and s.context.trace_id for s in spans):
        same_as_python(encode_spans(spans))


def test_remote_and_local_parents_and_links_keep_is_remote():
    res = resources()[1]
    spans = [direct_span("remote", {}, resource=res, scope=None, parent=SpanContext(1, 2, True)),
             direct_span("local", {}, resource=res, scope=None, parent=SpanContext(1, 3, False))]
    request = encode_spans(spans)
    same_as_python(request)
    got = decode(request)[0]
    assert [s.parent.is_remote for s in got] == [True, False]


def test_spans_of_one_trace_and_parent_share_their_id_and_parent_objects_and_repeated_ints_one_object():
    """What a request of rank spans repeats (one trace, one parent, the same counts and sizes) is one object in C
    (the trace ids and parent contexts made lately, a table of ints), only where the bytes are the same: a parent
    that differs, a remote flag that differs, a trace that differs under the same parent id, ints that share a
    slot of the table (10,000 values in its 4,096) each get their own, all as Python converts them."""
    res = resources()[1]
    t1, t2 = 0x0123456789ABCDEF0123456789ABCDEF, 0xFEDCBA98765432100123456789ABCDEF
    parents = [SpanContext(t1, 0x51, False)] * 3 + [SpanContext(t1, 0x52, False), SpanContext(t1, 0x52, True),
                                                      SpanContext(t2, 0x52, True), None, SpanContext(t2, 0x52, True)]
    spans = [direct_span(f"s{i}", {"count": 1 << 20, "nranks": 1024, "rank": 300 + i % 2, "small": 7,
                                   "neg": -(1 << 40)},
                         resource=res, scope=None, parent=p, trace_id=p.trace_id if p else t1, span_id=i + 1)
             for i, p in enumerate(parents)]
    spans += [direct_span(f"v{v}", {"v": v, "w": -v}, resource=res, scope=None, trace_id=t2, span_id=100 + v)
              for v in range(1000, 11000)]
    request = encode_spans(spans)
    same_as_python(request)
    got = decode(request)[0]
    first = got[0]
    assert all(s.context.trace_id is first.context.trace_id for s in got[1:5])
    assert got[1].parent is first.parent and got[2].parent is first.parent
    assert got[3].parent is not first.parent and got[4].parent is not got[3].parent  # another id; remote
    assert got[5].parent is not got[4].parent and got[5].parent.trace_id == t2  # the same id in another trace
    assert got[6].parent is None and got[7].parent is got[5].parent  # kept over a span without one
    assert got[5].context.trace_id is got[5].parent.trace_id
    assert all(s.attributes["count"] is first.attributes["count"] for s in got[1:8])
    assert got[2].attributes["rank"] is first.attributes["rank"] and got[1].attributes["rank"] == 301
    assert [(s.attributes["v"], s.attributes["w"]) for s in got[8:]] == [(v, -v) for v in range(1000, 11000)]


def test_spans_of_traces_interleaved_share_each_trace_id_and_parent_object():
    """Collectives of a few communicators in flight come interleaved (a span of each in turn): each trace keeps one
    trace id and one parent object across the others' spans; spans of 64 traces in turn (past the table's 16 slots)
    still decode as Python converts them."""
    res = resources()[1]
    traces = [(0x1000 + t) << 64 | 0xABC0 + t for t in range(8)]  # sequential ids, as a test's would be
    spans = [direct_span(f"r{r}", {"rank": r}, resource=res, scope=None, parent=SpanContext(t, 0x77, True),
                         trace_id=t, span_id=1 + r * 8 + i) for r in range(4) for i, t in enumerate(traces)]
    spans += [direct_span(f"w{i}", {}, resource=res, scope=None, parent=SpanContext(t, 0x9000 + t % 64, True),
                          trace_id=t, span_id=1000 + i)
              for i, t in enumerate([(7 + k % 64) << 70 | k % 64 for k in range(256)])]
    request = encode_spans(spans)
    same_as_python(request)
    got = decode(request)[0][:32]
    for i in range(8):
        of_trace = got[i::8]
        assert all(s.context.trace_id is of_trace[0].context.trace_id for s in of_trace), i
        assert all(s.parent is of_trace[0].parent for s in of_trace), i
    assert len({id(s.parent) for s in got}) == 8


def _request(resource: dict[str, Any], schema: str = "", span_id: int = 1) -> ExportTraceServiceRequest:
    from opentelemetry.sdk.resources import Resource

    span = ReadableSpan("op", context=SpanContext(7, span_id, is_remote=False), resource=Resource(resource, schema),
                        start_time=1, end_time=2)
    return encode_spans([span])


def test_a_resource_sent_again_is_the_same_object_equal_and_hashed_as_the_sdks():
    """Agents send the same resource in every request: one ReceivedResource serves them (made and hashed once)."""
    from opentelemetry.sdk.resources import Resource

    a = decode(_request({"host.name": "n1", "process.pid": 1}))[0][0].resource
    b = decode(_request({"host.name": "n1", "process.pid": 1}, span_id=2))[0][0].resource
    other = decode(_request({"host.name": "n1", "process.pid": 2}))[0][0].resource
    schema = decode(_request({"host.name": "n1", "process.pid": 1}, "https://opentelemetry.io/schemas/1.30.0"))[0][0]
    assert a is b
    assert other is not a and other != a
    assert schema.resource is not a and schema.resource.schema_url == "https://opentelemetry.io/schemas/1.30.0"
    sdk = Resource({"host.name": "n1", "process.pid": 1})
    assert type(a) is otlp_in.ReceivedResource
    assert a == sdk and sdk == a and hash(a) == hash(sdk) == hash(a)


def test_the_resource_cache_is_bounded_and_starts_over_when_full():
    from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]

    _, most, clears = _otlpdec.cache_info()["resources"]
    first = decode(_request({"host.name": "first"}))[0][0].resource
    for i in range(most + 1):
        decode(_request({"host.name": f"h{i}"}))
        size, _, _ = _otlpdec.cache_info()["resources"]
        assert size <= most
    assert _otlpdec.cache_info()["resources"][2] > clears  # emptied at least once
    again = decode(_request({"host.name": "first"}))[0][0].resource
    assert again == first and again is not first  # made anew once it had been cleared out


def test_a_scope_sent_again_is_the_same_object():
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    def request(version: str, host: str) -> ExportTraceServiceRequest:
        span = ReadableSpan("op", context=SpanContext(7, 1, is_remote=False), resource=Resource({"host.name": host}),
                            instrumentation_scope=InstrumentationScope("otel_ebpf.nccl", version), start_time=1,
                            end_time=2)
        return encode_spans([span])

    a, b = decode(request("1", "n1"))[0][0], decode(request("1", "n2"))[0][0]
    c = decode(request("2", "n1"))[0][0]
    assert a.instrumentation_scope is b.instrumentation_scope and a.resource is not b.resource
    assert c.instrumentation_scope is not a.instrumentation_scope and c.instrumentation_scope.version == "2"


def test_resource_spans_of_the_same_bytes_share_objects_in_both_paths():
    """Two ResourceSpans with the same resource and scope (what two agents' requests merged would give): C and
    Python alike give their spans one Resource and one scope."""
    one = _request({"host.name": "n1"})
    request = ExportTraceServiceRequest()
    request.MergeFrom(one)
    request.MergeFrom(_request({"host.name": "n1"}, span_id=2))
    assert len(request.resource_spans) == 2
    same_as_python(request)
    spans = decode(request)[0]
    assert spans[0].resource is spans[1].resource and spans[0].instrumentation_scope is spans[1].instrumentation_scope
