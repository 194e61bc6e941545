"""otel_ebpf.core.frozen.fast_init: every decorated record class builds the instances its dataclass __init__ builds."""
from __future__ import annotations

import dataclasses
import importlib
import pickle
import pkgutil
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

import otel_ebpf
from otel_ebpf.core.events import SpanEventRecord, SpanRecord
from otel_ebpf.core.frozen import fast_init, maker


def decorated() -> list[type]:
    """Every class in otel_ebpf given fast_init (its generated __init__ is named for it)."""
    out = []
    for mod in pkgutil.walk_packages(otel_ebpf.__path__, "otel_ebpf."):
        if mod.name.endswith("__main__") or "libnccl" in mod.name or mod.name.split(".")[-1].startswith("_"):
            continue
        module = importlib.import_module(mod.name)
        for obj in vars(module).values():
            if (isinstance(obj, type) and obj.__module__ == module.__name__ and dataclasses.is_dataclass(obj)
                    and obj.__init__.__code__.co_filename == "<string>"
                    and "_set0" in obj.__init__.__code__.co_names):
                out.append(obj)
    return out


CLASSES = decorated()


def sample_args(cls: type, seed: int) -> list[Any]:
    return [(seed * 7 + i) if i % 2 else f"v{seed}.{i}" for i, _ in enumerate(dataclasses.fields(cls))]


def reference(cls: type, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The instance the dataclass's own __init__ makes (a twin class, made by dataclasses from the same fields)."""
    twin = dataclasses.make_dataclass(cls.__name__, [(f.name, Any, field(default=f.default,
                                                                         default_factory=f.default_factory))
                                                     for f in dataclasses.fields(cls)], frozen=True, slots=True)
    return twin(*args, **kwargs)


def test_the_hot_records_are_decorated():
    names = {c.__name__ for c in CLASSES}
    assert {"SpanRecord", "MetricRecord", "SpanEventRecord", "MemcpyCall", "SyncCall", "KernelLaunch"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_instances_equal_the_dataclass_init_s_and_stay_frozen(cls: type):
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for seed in range(3):
        args = sample_args(cls, seed)
        for n in (len(required), len(fields)):  # defaults taken, then every field given
            got, ref = cls(*args[:n]), reference(cls, args[:n], {})
            assert [getattr(got, f.name) for f in fields] == [getattr(ref, f.name) for f in fields]
        kwargs = {f.name: a for f, a in zip(fields, args, strict=True)}
        got = cls(**kwargs)
        assert [getattr(got, f.name) for f in fields] == list(kwargs.values())
        assert got == cls(**kwargs) and hash(got) == hash(cls(**kwargs)) if cls.__hash__ else True
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(got, fields[0].name, 1)
        assert dataclasses.replace(got) == got and pickle.loads(pickle.dumps(got)) == got
    with pytest.raises(TypeError):
        cls(*range(len(fields) + 1))
    if required:
        with pytest.raises(TypeError):
            cls()


def test_a_default_factory_is_called_for_each_instance():
    a, b = SpanEventRecord("e", 1), SpanEventRecord("e", 2)
    assert a.attributes == {} and a.attributes is not b.attributes
    rec = SpanRecord(1, "x", 2, 3, {})
    assert rec.events == () and rec.scope == "otel_ebpf" and rec.kind == "internal"


def test_classes_it_cannot_serve_are_refused():
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class WithPost:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: InitVar[int] = 0

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KwOnly:
        a: int

    for cls in (NoSlots, NotFrozen, WithPost, WithInitVar, KwOnly):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)


MAKEABLE = [c for c in CLASSES if all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(c))]


@pytest.mark.parametrize("cls", MAKEABLE, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_maker_makes_what_the_class_makes_from_positional_values(cls: type):
    make = maker(cls)
    assert make is not cls, "the C extension is built by scripts/setup.sh"
    fields = dataclasses.fields(cls)
    required = sum(1 for f in fields if f.default is dataclasses.MISSING)
    for seed in range(3):
        args = sample_args(cls, seed)
        for n in range(required, len(fields) + 1):  # every number of defaults taken
            got, want = make(*args[:n]), cls(*args[:n])
            assert type(got) is cls and got == want and repr(got) == repr(want)
            assert [getattr(got, f.name) for f in fields] == [getattr(want, f.name) for f in fields]
            assert all(getattr(got, f.name) is getattr(want, f.name) for f in fields[n:])  # the defaults themselves
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(got, fields[0].name, 1)
            assert dataclasses.replace(got) == got and pickle.loads(pickle.dumps(got)) == got
    with pytest.raises(TypeError, match="values"):
        make(*range(len(fields) + 1))
    if required:
        with pytest.raises(TypeError, match="values"):
            make(*range(required - 1))
    with pytest.raises(TypeError, match="positional"):
        make(*sample_args(cls, 0)[:required], **{fields[-1].name: 1})


def test_maker_refuses_what_it_cannot_make_as_the_class_does():
    @dataclass(frozen=True, slots=True)
    class Plain:
        x: int

    @fast_init
    @dataclass(frozen=True, slots=True)
    class Fresh:
        x: list[int] = field(default_factory=list)

    with pytest.raises(TypeError, match="fast_init"):
        maker(Plain)
    with pytest.raises(TypeError, match="default_factory"):
        maker(Fresh)
