"""Validate Kubernetes manifests against the models of the official ``kubernetes`` Python client.

The client's models are generated from the Kubernetes OpenAPI spec: each model class has
``openapi_types`` (attribute -> type: ``str``, ``int``, ``bool``, ``float``, ``bytes``,
``datetime``, ``object``, ``List[T]``, ``Dict[str, T]`` or another model's class name) and
``attribute_map`` (attribute -> the JSON key, camelCase). Since client 37 the models are pydantic
models, whose ``model_fields`` say which fields are required and refine some ``object`` fields
(IntOrString ports, targetPort) to ``int | str``.

For each document, :func:`validate_doc` finds the model of its ``apiVersion``/``kind`` through the
client's API classes (``apps/v1`` -> ``AppsV1Api``, whose ``create_namespaced_daemon_set`` takes a
``V1DaemonSet``), then walks the document: every key must be a field of the model, every value
must have the declared type, every required field must be present. A walk without findings is
cross-checked by building the model (``model_validate``), so whatever else the client's
validators reject is reported too. Findings name the file, the document index (as in
``yaml.safe_load_all``) and the key path, e.g.
``deploy/k8s/agent.yaml[1].spec.template.spec.containers[0].securityContext.capabilites``.

Stricter than an API server in one documented way: resource quantities are ``str`` in the
client (``cpu: 1`` must be written ``cpu: "1"``).

Kinds the client has no model for are errors, except kustomize's ``Kustomization``
(``kustomize.config.k8s.io/v1beta1``): :func:`validate_kustomization` checks that it uses only
keys this module understands and that every listed resource exists, parses and validates.

Not thread-safe concerns: none (pure functions). Never raises on bad manifests: findings are
returned as strings; only a missing ``kubernetes`` package raises ``ImportError``.
"""
from __future__ import annotations

import datetime
import difflib
import functools
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from kubernetes import client

__all__ = ["KUSTOMIZE_API", "model_for", "validate_doc", "validate_file", "validate_kustomization"]

KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
# Kustomization keys validate_kustomization checks; any other is reported, not silently passed.
_KUSTOMIZE_KEYS = {"apiVersion", "kind", "resources", "namespace"}
_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "bytes": (str,),
    "datetime": (str, datetime.datetime, datetime.date),
}


def _api_class_name(group: str, version: str) -> str:
    """``rbac.authorization.k8s.io``, ``v1`` -> ``RbacAuthorizationV1Api``; core group -> ``CoreV1Api``."""
    if not group:
        return f"Core{version.capitalize()}Api"
    words = group.removesuffix(".k8s.io").split(".")
    return "".join(w.capitalize() for w in words) + version.capitalize() + "Api"


def _body_class(method: Any) -> Any:
    annotation = inspect.signature(method).parameters.get("body", inspect.Parameter).annotation
    if isinstance(annotation, str):
        annotation = getattr(client, annotation, None)
    return annotation if isinstance(annotation, type) and hasattr(annotation, "openapi_types") else None


@functools.cache
def model_for(api_version: str, kind: str) -> tuple[Any, bool] | None:
    """(model class, namespaced) of a top-level kind, or None when the client has no such kind.

    The kind must be the body of a ``create_*`` method of its group/version's API class, so a kind
    under the wrong group (``batch/v1`` DaemonSet) is not found.
    """
    group, _, version = api_version.rpartition("/")
    api = getattr(client, _api_class_name(group, version), None)
    if api is None:
        return None
    suffix = version.capitalize() + kind
    for name, method in inspect.getmembers(api, inspect.isfunction):
        if not name.startswith("create_") or name.endswith("_with_http_info"):
            continue
        body = _body_class(method)
        # V1DaemonSet, or group-prefixed where two groups share a kind name (CoreV1Event, EventsV1Event)
        prefix = body.__name__[: -len(suffix)] if body is not None and body.__name__.endswith(suffix) else None
        if prefix is not None and (prefix == "" or prefix.isalpha()):
            return body, name.startswith("create_namespaced_")
    return None


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    return f"{path}.{text}" if _PLAIN_KEY.match(text) else f"{path}[{text!r}]"


def _int_or_string(model: Any, attr: str) -> bool:
    """Whether the pydantic annotation of an ``object`` field is ``int | str`` (IntOrString)."""
    field = getattr(model, "model_fields", {}).get(attr)
    if field is None:
        return False
    leaves = set()
    for arg in typing.get_args(field.annotation):
        arg = typing.get_args(arg)[0] if typing.get_origin(arg) is typing.Annotated else arg
        if arg is not type(None):
            leaves.add(arg)
    union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
    return union and leaves == {int, str}


def _required(model: Any) -> list[str]:
    fields = getattr(model, "model_fields", {})
    return [attr for attr, f in fields.items() if f.is_required()]


def _check_model(value: Any, model: Any, path: str, out: list[str]) -> None:
    if not isinstance(value, dict):
        out.append(f"{path}: expected an object ({model.__name__}), got {type(value).__name__}")
        return
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    for key, item in value.items():
        attr = by_key.get(key)
        if attr is None:
            near = difflib.get_close_matches(str(key), by_key, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            out.append(f"{_join(path, key)}: unknown field of {model.__name__}{hint}")
            continue
        if item is None:  # YAML "key:" with no value: the API server treats null as absent
            continue
        type_str = model.openapi_types[attr]
        if type_str == "object" and _int_or_string(model, attr):
            type_str = "int|str"
        _check(item, type_str, _join(path, key), out)
    for attr in _required(model):
        if value.get(model.attribute_map[attr]) is None:
            out.append(f"{_join(path, model.attribute_map[attr])}: missing required field of {model.__name__}")


def _check(value: Any, type_str: str, path: str, out: list[str]) -> None:
    if type_str == "object":
        return
    if type_str == "int|str":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            out.append(f"{path}: expected an int or a string, got {type(value).__name__}")
        return
    if type_str in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[type_str])
        if isinstance(value, bool) and type_str != "bool":
            ok = False
        if not ok:
            out.append(f"{path}: expected {type_str}, got {type(value).__name__} {value!r}")
        return
    if m := _LIST.match(type_str):
        if not isinstance(value, list):
            out.append(f"{path}: expected a list ({type_str}), got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), _join(path, i), out)
        return
    if m := _DICT.match(type_str):
        if not isinstance(value, dict):
            out.append(f"{path}: expected a mapping ({type_str}), got {type(value).__name__}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                out.append(f"{_join(path, key)}: map keys must be strings, got {type(key).__name__}")
            _check(item, m.group(1), _join(path, key), out)
        return
    model = getattr(client, type_str, None)
    if model is None or not hasattr(model, "attribute_map"):
        out.append(f"{path}: the kubernetes client declares type {type_str!r}, which this validator does not know")
        return
    _check_model(value, model, path, out)


def _pydantic_findings(doc: dict[str, Any], model: Any, where: str) -> list[str]:
    validate = getattr(model, "model_validate", None)
    if validate is None:
        return []
    try:
        validate(doc)
    except Exception as e:  # pydantic.ValidationError; anything else is a finding too
        errors = getattr(e, "errors", None)
        if not callable(errors):
            return [f"{where}: {model.__name__} rejects the document: {e}"]
        found = []
        for err in errors():
            path = where
            for part in err.get("loc", ()):
                path = _join(path, part)
            found.append(f"{path}: {model.__name__} rejects it: {err.get('msg')}")
        return found
    return []


def validate_doc(doc: Any, where: str) -> list[str]:
    """Findings for one manifest document; ``where`` prefixes every finding (``file[index]``)."""
    if not isinstance(doc, dict):
        return [f"{where}: a manifest must be a mapping, got {type(doc).__name__}"]
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"{where}: apiVersion and kind must both be strings"]
    found = model_for(api_version, kind)
    if found is None:
        return [f"{where}: the kubernetes client {kubernetes.__version__} has no model for "
                f"{api_version} {kind} (a custom resource or a typo: validate it elsewhere)"]
    model, namespaced = found
    out: list[str] = []
    _check_model(doc, model, where, out)
    metadata = doc.get("metadata") or {}
    if not metadata.get("name"):
        out.append(f"{_join(where, 'metadata')}.name: every applied object needs a name")
    if not namespaced and isinstance(metadata, dict) and metadata.get("namespace"):
        out.append(f"{_join(where, 'metadata')}.namespace: {kind} is cluster-scoped and takes no namespace")
    return out or _pydantic_findings(doc, model, where)


def _load_all(path: Path, shown: str) -> tuple[list[Any], list[str]]:
    try:
        return list(yaml.safe_load_all(path.read_text())), []
    except (OSError, yaml.YAMLError) as e:
        return [], [f"{shown}: cannot read or parse: {e}"]


def validate_kustomization(doc: dict[str, Any], base: Path, where: str, root: Path) -> list[str]:
    """Kustomize's Kustomization has no model in the client: check its resources instead.

    Every entry of ``resources`` must be an existing file under ``base`` whose documents validate;
    keys other than apiVersion, kind, resources and namespace are reported as not validated here.
    """
    out = [f"{_join(where, key)}: kustomization key not validated by tests/support/k8s_schema.py"
           for key in doc if key not in _KUSTOMIZE_KEYS]
    resources = doc.get("resources")
    if not isinstance(resources, list) or not resources:
        return [*out, f"{where}.resources: expected a non-empty list of manifest files"]
    for i, entry in enumerate(resources):
        target = base / str(entry)
        if not isinstance(entry, str) or not target.is_file():
            out.append(f"{_join(_join(where, 'resources'), i)}: {entry!r} is not a file next to the kustomization")
            continue
        out += validate_file(target, root)
    return out


def validate_file(path: Path, root: Path) -> list[str]:
    """Findings for every document of a manifest file; paths in them are relative to ``root``."""
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    docs, out = _load_all(path, shown)
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"{shown}[{index}]"
        if isinstance(doc, dict) and doc.get("kind") == "Kustomization" and doc.get("apiVersion") == KUSTOMIZE_API:
            out += validate_kustomization(doc, path.parent, where, root)
        else:
            out += validate_doc(doc, where)
    return out
