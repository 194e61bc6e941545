"""Config, names and environment variables in the docs for tests/e2e/test_docs_commands.py: YAML blocks
loaded by the real loaders (and their shown defaults compared with ``--defaults``), config key paths,
``otel_ebpf.*`` names and ``OTEL_EBPF_*`` variables looked up in the code.

Every problem is a string ``<doc>:<line>: <what is wrong>``; the functions never raise for a bad doc.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import re
import subprocess
import tempfile
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from otel_ebpf.core.errors import ConfigError
from tests.support.doc_commands import ROOT, Block, Doc, in_order, otel_ebpf_command

__all__ = ["Loader", "env_problems", "key_problems", "make_loaders", "name_problems", "yaml_problems"]

# OpenTelemetry resource attributes that start like a config section (semantic conventions, not config keys)
SEMCONV = {"service.name", "service.namespace", "service.instance.id", "service.version"}
_NAME = re.compile(r"(?<![\w./-])otel_ebpf(?:\.(?:[A-Za-z_]\w*|<[\w-]+>))+")
_KEY = re.compile(r"(?<![\w./-])(?:receivers|processors|exporters|service)"
                  r"(?:\.(?:[\w/-]+|<[\w-]+>|\*)(?:\[[\w<>]*\])*)+")
_ENV = re.compile(r"\bOTEL_EBPF_[A-Z0-9][A-Z0-9_]*\b")
_MOVED = re.compile(r"\b(?:moved|renamed|is now|are now|unknown key)\b")
_COMMENTED_KEY = re.compile(r"^(\s*)#\s?([A-Za-z_]\w*:(?:\s.*)?)$")


# ---- config ------------------------------------------------------------------------------------------
@dataclass
class Loader:
    kind: str  # "agent" or "gateway"
    load: Callable[[str], Any]
    defaults: Any  # the typed config `otel-ebpf <config|gateway> --defaults` prints, loaded by `load`


def _write(text: str, directory: str) -> str:
    fd, path = tempfile.mkstemp(suffix=".yaml", dir=directory)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


def make_loaders(tmp: str) -> list[Loader]:
    from otel_ebpf.gateway import config as gateway_config
    from otel_ebpf.service import settings

    out = []
    for kind, args, load in (("agent", ["config", "--defaults"], settings.load),
                             ("gateway", ["gateway", "--defaults"], gateway_config.load)):
        r = subprocess.run([*otel_ebpf_command(), *args], capture_output=True, text=True, timeout=60, cwd=tmp)
        assert r.returncode == 0, r.stderr
        out.append(Loader(kind, load, load(_write(r.stdout, tmp))))
    return out


def load_block(body: str, loaders: list[Loader], tmp: str) -> tuple[Loader | None, Any, str]:
    """(loader, typed config, "") from the first loader that accepts ``body``; else (None, None, errors).
    An example of ``receivers.probes`` names libraries of another host (/opt/app/libinfer.so): it is
    validated with ``check_targets: false`` (its documented switch: targets are then checked at start)."""
    data = yaml.safe_load(body) or {}
    probes = (data.get("receivers") or {}).get("probes") if isinstance(data, dict) else None
    if isinstance(probes, dict) and probes.get("probes") and "check_targets" not in probes:
        probes["check_targets"] = False
        body = yaml.safe_dump(data, sort_keys=False)
    path = _write(body, tmp)
    errors = []
    for loader in loaders:
        try:
            return loader, loader.load(path), ""
        except ConfigError as exc:
            errors.append(f"{loader.kind}: {exc}")
    return None, None, "; ".join(errors)


def leaves(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from leaves(v, (*path, str(k)))
    else:
        yield path


def at(cfg: Any, path: tuple[str, ...]) -> Any:
    """The typed value at a key path (a dict key or a dataclass field per step)."""
    for key in path:
        if isinstance(cfg, dict):
            cfg = cfg[key]
        elif dataclasses.is_dataclass(cfg):
            cfg = getattr(cfg, key)
        else:
            raise KeyError(key)
    return cfg


def _compare(where: str, path: tuple[str, ...], shown: Any, loader: Loader, what: str) -> list[str]:
    try:
        real = at(loader.defaults, path)
        value = at(shown, path)
    except (KeyError, AttributeError):
        return [f"{where}: {'.'.join(path)} {what} is not a key of the {loader.kind} config"]
    if value != real:
        return [f"{where}: {'.'.join(path)} {what} shows {value!r}; the real default is {real!r}"]
    return []


def _commented_keys(block: Block, loader: Loader, tmp: str) -> list[str]:
    problems = []
    lines = block.body.split("\n")
    original = yaml.safe_load(block.body) or {}
    for n, line in enumerate(lines):
        m = _COMMENTED_KEY.match(line)
        if not m:
            continue
        variant = "\n".join([*lines[:n], m.group(1) + m.group(2), *lines[n + 1:]])
        where = f"line {block.line + n}"
        try:
            added = [p for p in leaves(yaml.safe_load(variant)) if p not in set(leaves(original))]
        except yaml.YAMLError:
            added = []
        if len(added) != 1:
            problems.append(f"{where}: the commented key {m.group(2).split(':')[0]!r} is not one key once uncommented")
            continue
        used, cfg, error = load_block(variant, [loader], tmp)
        if used is None:
            problems.append(f"{where}: uncommented, {error}")
            continue
        problems += _compare(where, added[0], cfg, loader, "(commented out: its default)")
    return problems


def _line_of(block: Block, path: tuple[str, ...]) -> int:
    """The line of ``path``'s last key in the block (the block's first line when it cannot be told)."""
    for n, line in enumerate(block.body.split("\n")):
        if re.match(rf"^\s*{re.escape(path[-1])}\s*:", line):
            return block.line + n
    return block.line


def yaml_problems(docs: list[Doc], loaders: list[Loader], tmp: str) -> list[str]:
    problems = []
    for doc in docs:
        for block in doc.blocks:
            if block.lang not in ("yaml", "yml") or block.info:
                continue
            where = f"{doc.name}:{block.line}"
            loader, cfg, error = load_block(block.body, loaders, tmp)
            if loader is None:
                problems.append(f"{where}: the config block does not load: {error}")
                continue
            if "config --defaults" in block.lead or "gateway --defaults" in block.lead:
                for path in leaves(yaml.safe_load(block.body)):
                    problems += _compare(f"{doc.name}:{_line_of(block, path)}", path, cfg, loader, "(a defaults block)")
            problems += [f"{doc.name}:{p.removeprefix('line ')}" if p.startswith("line ") else p
                         for p in _commented_keys(block, loader, tmp)]
    return in_order(problems)


def _children(node: Any, part: str) -> list[tuple[Any, Any]]:
    """(value, type hint) of the children of ``node`` that ``part`` names: a dict key (``<x>`` any key; an id
    ``otlp/backup`` is of type ``otlp``) or a dataclass field, from an instance or, past a list index, a class."""
    if isinstance(node, dict):
        if part.startswith("<") or part == "*":
            return [(v, None) for v in node.values()]
        key = part if part in node else part.split("/")[0]
        return [(node[key], None)] if key in node else []
    if dataclasses.is_dataclass(node):
        cls = node if isinstance(node, type) else type(node)
        if part.startswith("<") or part == "*":
            return [c for f in dataclasses.fields(cls) for c in _children(node, f.name)]
        if part not in {f.name for f in dataclasses.fields(cls)}:
            return []
        try:
            hint = typing.get_type_hints(cls).get(part)
        except Exception:  # an unresolvable annotation: the value still says what is there
            hint = None
        return [(getattr(node, part, None) if not isinstance(node, type) else None, hint)]
    return []


def key_exists(node: Any, parts: list[str]) -> bool:
    """``parts`` (``["service", "pipelines", "<p>", "receivers[i]"]``) is a key path in the typed config ``node``."""
    if not parts:
        return True
    part, index = re.match(r"^([^\[]*)((?:\[[^\]]*\])*)$", parts[0]).groups()  # type: ignore[union-attr]
    for value, hint in _children(node, part):
        if index:  # a list: go on into its element type (the default list may be empty)
            args = typing.get_args(hint)
            if not parts[1:]:
                return isinstance(value, list) or typing.get_origin(hint) is list
            value = value[0] if isinstance(value, list) and value else (args[0] if args else None)
        if key_exists(value, parts[1:]):
            return True
    return False


def moved(key: str, paragraph: str, loaders: list[Loader]) -> bool:
    """A key the paragraph says moved (``receivers.sched.ringbuf_pages`` is now ``receivers.lifecycle...``,
    an old config's 'unknown key' error) is named on purpose: it must exist under another component."""
    parts = key.split(".")
    return (len(parts) > 2 and _MOVED.search(paragraph) is not None
            and any(key_exists(lo.defaults, [parts[0], "*", *parts[2:]]) for lo in loaders))


def key_problems(docs: list[Doc], loaders: list[Loader]) -> list[str]:
    problems = []
    for doc in docs:
        for line, span, paragraph in doc.spans_in_paragraphs:
            for m in _KEY.finditer(span):
                key = m.group(0)
                if key in SEMCONV or any(key_exists(lo.defaults, key.split(".")) for lo in loaders):
                    continue
                if moved(key, paragraph, loaders):
                    continue
                if "<" not in key and name_exists(f"otel_ebpf.{key}"):
                    continue  # processors.python.call_ids: a function of that package, not a config key
                problems.append(f"{doc.name}:{line}: config key {key} is in neither the agent's nor the "
                                "gateway's defaults")
    return in_order(problems)


# ---- names and environment --------------------------------------------------------------------------
@cache
def emitted_names() -> frozenset[str]:
    """Every whole string literal in otel_ebpf/ that starts with ``otel_ebpf.``: metric, scope, event names."""
    found: set[str] = set()
    for path in (ROOT / "otel_ebpf").rglob("*.py"):
        found.update(re.findall(r"""["'](otel_ebpf(?:\.\w+)+)["']""", path.read_text(errors="replace")))
    return frozenset(found)


def _resolve(obj: Any, rest: list[str]) -> bool:
    for i, part in enumerate(rest):
        if part.startswith("<"):  # otel_ebpf.receivers.<name>.events: any child that has the rest
            names = [m.name for m in pkgutil.iter_modules(getattr(obj, "__path__", []))]
            return any(_resolve(obj, [n, *rest[i + 1:]]) for n in names)
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        except (ImportError, AttributeError, TypeError):
            return False
    return True


def name_exists(name: str) -> bool:
    if name in emitted_names():
        return True
    return _resolve(importlib.import_module("otel_ebpf"), name.split(".")[1:])


def name_problems(docs: list[Doc]) -> list[str]:
    problems = []
    for doc in docs:
        for m in _NAME.finditer(doc.text):
            if not name_exists(m.group(0)):
                line = doc.text.count("\n", 0, m.start()) + 1
                problems.append(f"{doc.name}:{line}: {m.group(0)} is neither a module or attribute nor a name the "
                                "code emits")
    return in_order(problems)


def _expand(prefixes: dict[str, str]) -> dict[str, str]:
    return {k: re.sub(r"\{(\w+)\}", lambda m: prefixes.get(m.group(1), m.group(0)), v) for k, v in prefixes.items()}


@cache
def env_names_read() -> frozenset[str]:
    """OTEL_EBPF_* names in the code (otel_ebpf/, scripts/, bench/): literals, and ``{ENV_PREFIX}X`` with the
    prefix constants expanded; in tests/ only those read (``os.environ.get("X")``: the soak switch)."""
    files = [p for d in ("otel_ebpf", "scripts", "bench") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".c", ".h", ".sh")]
    texts = [p.read_text(errors="replace") for p in files]
    reads = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*["'](OTEL_EBPF_\w+)["']""")
    prefixes: dict[str, str] = {}
    for text in texts:
        for name, value in re.findall(r"^(\w*ENV_PREFIX)\s*=\s*f?\"([^\"]*)\"", text, re.M):
            prefixes[name] = value
    for _ in range(3):  # GATEWAY_ENV_PREFIX = f"{ENV_PREFIX}GATEWAY_"
        prefixes = _expand(prefixes)
    found: set[str] = set()
    for text in texts:
        found.update(_ENV.findall(text))
        found.update(prefixes[p] + rest for p, rest in re.findall(r"\{(\w*ENV_PREFIX)\}(\w+)", text) if p in prefixes)
    for path in (ROOT / "tests").rglob("*.py"):
        found.update(reads.findall(path.read_text(errors="replace")))
    return frozenset(found)


def env_problems(docs: list[Doc]) -> list[str]:
    problems = []
    for doc in docs:
        for m in _ENV.finditer(doc.text):
            if m.group(0) not in env_names_read():
                line = doc.text.count("\n", 0, m.start()) + 1
                problems.append(f"{doc.name}:{line}: {m.group(0)} is read nowhere in the code")
    return in_order(problems)
