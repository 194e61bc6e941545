"""Reading the docs for tests/e2e/test_docs_commands.py: fenced blocks, inline code spans, and the
``otel-ebpf`` command lines in them checked against the real argument parser.

Every problem is a string ``<doc>:<line>: <what is wrong>``; the functions never raise for a bad doc.
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["DOCS", "ROOT", "Block", "Doc", "build_parser", "command_problems", "command_texts", "fill", "in_order",
           "invocations", "load_docs", "otel_ebpf_command", "subcommands"]

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)[ \t]*(.*)$")
_INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_INVOKES = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?(?:otel-ebpf|python3?(?:\.\d+)?\s+-m\s+otel_ebpf)(?=\s|$)")
_PLACEHOLDER = re.compile(r"^(?:PH_\S+|[A-Z][A-Z0-9_:]*|\.\.\.)$")
_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
_REDIRECTS = {">", ">>", "<", "<<", "&>", ">&", ">|"}


@dataclass(frozen=True)
class Block:
    lang: str
    info: str
    line: int  # of the first line inside the fence
    body: str
    lead: str  # the last non-blank line before the fence


@dataclass(frozen=True)
class Doc:
    name: str
    text: str

    @property
    def blocks(self) -> list[Block]:
        return _split(self.text)[0]

    @property
    def spans(self) -> list[tuple[int, str]]:
        """Inline code spans (line, text) outside fenced blocks, newlines inside a span made spaces."""
        return [(line, text) for line, text, _ in self.spans_in_paragraphs]

    @property
    def spans_in_paragraphs(self) -> list[tuple[int, str, str]]:
        """(line, span text, the paragraph around it)."""
        prose = _split(self.text)[1]
        out = []
        for m in _INLINE.finditer(prose):
            if "\n\n" in m.group(2):
                continue
            start, end = prose.rfind("\n\n", 0, m.start()), prose.find("\n\n", m.end())
            out.append((prose.count("\n", 0, m.start()) + 1, m.group(2).replace("\n", " "),
                        prose[max(start, 0):end if end >= 0 else len(prose)]))
        return out


@cache
def _split(text: str) -> tuple[list[Block], str]:
    """Fenced blocks, and the text with every fenced line blanked (line numbers kept)."""
    blocks: list[Block] = []
    lines = text.split("\n")
    prose = list(lines)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(2), i
        lead = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        body = "\n".join(ln[len(m.group(1)):] if ln.startswith(m.group(1)) else ln for ln in lines[start + 1:i])
        blocks.append(Block(m.group(3).lower(), m.group(4).strip(), start + 2, body, lead))
        for j in range(start, min(i + 1, len(lines))):
            prose[j] = ""
        i += 1
    return blocks, "\n".join(prose)


def load_docs() -> list[Doc]:
    return [Doc(str(p.relative_to(ROOT)), p.read_text()) for p in DOCS]


# ---- commands --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The CLI's own parser builder, wherever it lives (cli.py builds it; it may move to service/)."""
    for module, names in (("otel_ebpf.cli", ("build_parser", "parser", "_parser")),
                          ("otel_ebpf.service.run_cmd", ("build_parser",))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        for name in names:
            if callable(getattr(mod, name, None)):
                parser = getattr(mod, name)()
                if isinstance(parser, argparse.ArgumentParser):
                    return parser
    raise AssertionError("no argument parser builder found in otel_ebpf.cli: update build_parser() here")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_texts(doc: Doc) -> Iterator[tuple[int, str, bool]]:
    """(line, text, inline) of each shell line (backslash continuations joined) and inline span naming the CLI."""
    for block in doc.blocks:
        if block.lang not in SHELL_LANGS:
            continue
        joined = ""
        first = 0
        for n, text in enumerate(block.body.split("\n")):
            if not joined:
                first = block.line + n
            if text.rstrip().endswith("\\"):
                joined += text.rstrip()[:-1] + " "
                continue
            joined += text
            if _INVOKES.search(joined):
                yield first, joined, False
            joined = ""
    for line, span in doc.spans:
        if _INVOKES.search(span):
            yield line, span, True


def invocations(text: str) -> list[list[str]]:
    """The argument lists given to otel-ebpf in one shell line (``a && otel-ebpf x | y`` -> [["x"]])."""
    text = re.sub(r"<([\w.:/-]+)>", r"PH_\1", text)  # <loop>, <node-0>: placeholders, not redirections
    text = re.sub(r"(?<=[^\s|])\|[^\s\]|]+(?:\|[^\s\]|]+)*", "", text)  # grpc|http -> grpc
    while re.search(r"\[[^\[\]]*\]", text):
        text = re.sub(r"\[([^\[\]]*)\]", r"\1", text)  # [--output DIR] -> --output DIR
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    segments: list[list[str]] = [[]]
    skip = False
    for tok in lexer:
        if skip:
            skip = False
        elif tok in _OPERATORS:
            segments.append([])
        elif tok in _REDIRECTS:
            skip = True
            if segments[-1] and segments[-1][-1].isdigit():
                segments[-1].pop()  # 2>/dev/null
        else:
            segments[-1].append(tok)
    out = []
    for seg in segments:
        while seg and (seg[0] in ("$", "sudo", "env", "exec", "time") or re.match(r"^[A-Za-z_]\w*=", seg[0])
                       or (seg[0].startswith("-") and seg[0] != "--")):
            seg = seg[1:]  # prompt, sudo and its flags, VAR=value
        if not seg:
            continue
        prog = os.path.basename(seg[0])
        if prog == "otel-ebpf" and len(seg) > 1:
            out.append(seg[1:])
        elif re.fullmatch(r"python3?(\.\d+)?", prog) and seg[1:3] == ["-m", "otel_ebpf"] and len(seg) > 3:
            out.append(seg[3:])
    return out


def _value(action: argparse.Action, token: str) -> str:
    if not _PLACEHOLDER.match(token):
        return token
    if action.choices:
        return str(next(iter(action.choices)))
    if action.type in (int, float):
        return "1"
    return token


def fill(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """Placeholders after typed options replaced by a valid value: ``--nodes N`` -> ``--nodes 1``."""
    out: list[str] = []
    current, expect = parser, None
    for i, tok in enumerate(args):
        if expect is not None:
            out.append(_value(expect, tok))
            expect = None
            continue
        if tok == "--":
            return out + args[i:]
        if tok.startswith("-"):
            action = current._option_string_actions.get(tok.split("=", 1)[0])
            if action is not None and action.nargs != 0 and "=" not in tok:
                expect = action
        elif current is parser and tok in subcommands(parser):
            current = subcommands(parser)[tok]
        out.append(tok)
    return out


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when the parser accepts ``args``, else its error line."""
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            parser.parse_args(fill(parser, args))
    except SystemExit as exc:
        if exc.code not in (0, None):
            lines = err.getvalue().strip().splitlines()
            return lines[-1] if lines else f"exit {exc.code}"
    return None


def command_problems(docs: list[Doc], parser: argparse.ArgumentParser, used: set[str] | None = None) -> list[str]:
    problems = []
    for doc in docs:
        for line, text, inline in command_texts(doc):
            try:
                calls = invocations(text)
            except ValueError as exc:
                problems.append(f"{doc.name}:{line}: cannot read the command {text!r}: {exc}")
                continue
            for args in calls:
                if inline and len(args) == 1 and not args[0].startswith("-"):  # prose naming `otel-ebpf report`
                    error = None if args[0] in subcommands(parser) else f"no subcommand {args[0]!r}"
                else:
                    error = parse_error(parser, args)
                if error:
                    problems.append(f"{doc.name}:{line}: 'otel-ebpf {' '.join(args)}': {error}")
                elif used is not None:
                    used.update(a for a in args if a in subcommands(parser))
    return in_order(problems)


def in_order(problems: list[str]) -> list[str]:
    """By document, then line."""
    def key(p: str) -> tuple[str, int]:
        m = re.match(r"^([^:]+):(\d+):", p)
        return (m.group(1), int(m.group(2))) if m else (p, 0)
    return sorted(problems, key=key)


def otel_ebpf_command() -> list[str]:
    """The installed console script next to this Python (``python -m otel_ebpf`` without one)."""
    script = Path(sys.executable).parent / "otel-ebpf"
    return [str(script)] if script.exists() else [sys.executable, "-m", "otel_ebpf"]
