"""A faster ``__init__`` for the frozen, slotted dataclasses on the record path, with the same behaviour.

``@dataclass(frozen=True, slots=True)`` writes each field in its generated ``__init__`` with
``object.__setattr__(self, name, value)`` (a global and an attribute looked up, and a call, per field: CPython 3.11
``dataclasses._field_init``), which makes a 14-field record cost ~1.6 µs, twice the record's other work. A frozen
class refuses ``self.x = v``, so the generated code cannot store fields directly. :func:`fast_init` replaces that
``__init__`` with one that stores each argument through its slot's own descriptor (``Cls.x.__set__(self, v)``, the
store ``object.__setattr__`` ends in), the descriptors bound once when the class is made: ~0.8 µs for 14 fields.

Everything else stays the dataclass's: the fields, their order, defaults and ``default_factory`` (called per
instance, as the dataclass does), the frozen ``__setattr__``/``__delattr__``, ``__eq__``/``__hash__``/``__repr__``,
``dataclasses.replace`` (which calls the new ``__init__``). A class with what this ``__init__`` does not do
(``__post_init__``, ``InitVar``, ``init=False`` fields, keyword-only fields, no slots, not frozen) is refused at
import with TypeError, so no record is ever built differently. tests/unit/core/test_frozen.py compares every
decorated class's instances with the dataclass's own ``__init__``.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["fast_init", "has_fast_init", "maker"]

T = TypeVar("T")

try:
    from otel_ebpf.core import _frozen  # type: ignore[attr-defined]
except ImportError:  # the optional extension is not built: maker() gives the class itself
    _frozen = None


class _Factory:
    """The default of a field with a ``default_factory``: replaced by a fresh value per instance."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
_DECORATED: set[type] = set()  # the classes fast_init gave its __init__ (for has_fast_init)


def _check(cls: type) -> list[dataclasses.Field[Any]]:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__name__} has __post_init__")
    fields = list(dataclasses.fields(cls))
    taken = list(inspect.signature(vars(cls)["__init__"]).parameters)[1:]
    if taken != [f.name for f in fields]:  # an InitVar is an argument that is no field
        raise TypeError(f"fast_init: {cls.__name__}.__init__ takes {taken}, not its fields")
    for f in fields:
        if not f.init or f.kw_only:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is init=False or keyword-only")
    return fields


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen slotted dataclass ``cls`` the faster ``__init__`` (module doc); returns ``cls``."""
    fields = _check(cls)
    ns: dict[str, Any] = {"_FACTORY": _FACTORY}
    params, body = [], []
    for i, f in enumerate(fields):
        ns[f"_set{i}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        if f.default is not dataclasses.MISSING:
            ns[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _factory{i}()\n")
        else:
            params.append(f.name)
        body.append(f"    _set{i}(self, {f.name})\n")
    src = f"def __init__(self, {', '.join(params)}):\n{''.join(body) or '    pass'}\n"
    exec(src, ns)  # generated from the class's own field names, as dataclasses does
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = vars(cls)["__init__"].__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - a class attribute, set as dataclasses sets it
    _DECORATED.add(cls)
    return cls


def has_fast_init(cls: type) -> bool:
    """Whether ``cls`` has :func:`fast_init`'s ``__init__`` (one that only stores its arguments in their slots, no
    field with a ``default_factory`` left out): what a C decoder that fills the slots itself may rely on."""
    return cls in _DECORATED and vars(cls).get("__init__") is not None and \
        vars(cls)["__init__"].__qualname__ == f"{cls.__qualname__}.__init__"



def maker(cls: type[T]) -> Callable[..., T]:
    """A callable that makes ``cls(*values)`` from positional values only, without running Python code: the same
    instance, its slots filled in C (otel_ebpf/core/_frozen.c; ~0.1 us against ~0.7 for a 14-field record). ``cls``
    itself when the extension is not built. For the hot paths (a span record per CUDA call); tests/unit/core/
    test_frozen.py compares it with the class. Raises TypeError for a class without :func:`fast_init` or with a
    ``default_factory`` field."""
    if not has_fast_init(cls):
        raise TypeError(f"maker: {cls.__name__} has no fast_init __init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"maker: {cls.__name__} has a default_factory field")
    if _frozen is None:
        return cls
    required = sum(1 for f in fields if f.default is dataclasses.MISSING)
    defaults = tuple(None if f.default is dataclasses.MISSING else f.default for f in fields)
    made: Callable[..., T] = _frozen.Maker(cls, tuple(f.name for f in fields), defaults, required)
    return made
