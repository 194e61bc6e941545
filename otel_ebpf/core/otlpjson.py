"""OTLP/JSON codec: the protobuf JSON mapping, except that trace and span ids are hex.

The OTLP/JSON encoding (OTLP specification, "JSON Protobuf Encoding") differs from the plain
protobuf JSON mapping in one way that matters here: ``traceId``, ``spanId`` and
``parentSpanId`` are lowercase hex strings, not base64. Keys are lowerCamelCase (snake_case is
accepted on input), enums may be integers or names, unknown fields are ignored.
Pure functions, thread-safe. Used by the file exporter (otel_ebpf.emit.jsonfile) and the OTLP receiver.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

__all__ = ["parse_otlp_json", "to_otlp_json"]

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def _convert_ids(node: Any, convert: Callable[[str], str]) -> None:
    """Rewrite every trace/span id string in a decoded JSON tree, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = convert(value)
            elif isinstance(value, (dict, list)):
                _convert_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _convert_ids(item, convert)


def _hex_to_b64(text: str) -> str:
    try:  # not hex: leave it for json_format, which accepts (lenient, non-spec) base64
        return base64.b64encode(bytes.fromhex(text)).decode("ascii")
    except ValueError:
        return text


def _b64_to_hex(text: str) -> str:
    return base64.b64decode(text).hex()


def parse_otlp_json(data: bytes | str | dict[str, Any], message_cls: type[Message]) -> Message:
    """Parse OTLP/JSON (hex ids, enums as ints or names, unknown fields ignored).

    Raises ``ValueError`` (``JSONDecodeError``; not an object) or ``json_format.ParseError``
    (wrong fields or values; not a ``ValueError`` subclass) when malformed.
    """
    tree = json.loads(data) if isinstance(data, (bytes, str)) else json.loads(json.dumps(data))
    if not isinstance(tree, dict):
        raise ValueError("OTLP/JSON body must be a JSON object")
    _convert_ids(tree, _hex_to_b64)
    return json_format.ParseDict(tree, message_cls(), ignore_unknown_fields=True)


def to_otlp_json(message: Message) -> str:
    """One-line OTLP/JSON (lowerCamelCase keys, hex ids, int enums), like the collector's."""
    tree = json_format.MessageToDict(message, use_integers_for_enums=True)
    _convert_ids(tree, _b64_to_hex)
    return json.dumps(tree, separators=(",", ":"))
