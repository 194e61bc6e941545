"""Redaction of secrets in a process's command line before it is exported.

:func:`redact_command_line` replaces secret values in argv by :data:`REDACTED` and keeps the
keys, so a span still shows which options a job ran with. Which keys count as secret is
:data:`DEFAULT_REDACT_PATTERNS` unless the caller passes its own. Pure functions, thread-safe,
never raising for ``str`` input. Split out of :mod:`otel_ebpf.host.processes`, which re-exports all three.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence

__all__ = ["DEFAULT_REDACT_PATTERNS", "REDACTED", "redact_command_line"]

REDACTED = "<redacted>"

#: Key names whose values are redacted. A key matches when it *ends with* the pattern's words,
#: after lower-casing and splitting on ``-``, ``_``, ``.`` and camelCase: ``--hf-token``,
#: ``HF_TOKEN=`` and ``--apiKey`` match, ``--tokenizer``, ``--max-tokens``, ``--token-budget``
#: and ``--password-file`` do not. ``-p`` is not here: it means port (ssh, docker, redis-cli),
#: parents (mkdir) or processes as often as password, and redacting ports hurts debugging.
#: ``pwd`` is not here either: ``PWD=`` is the working directory.
DEFAULT_REDACT_PATTERNS: tuple[str, ...] = (
    "password", "passwd", "passphrase", "secret", "token", "auth", "authorization", "credentials",
    "api-key", "apikey", "access-key", "access-key-id", "secret-key", "private-key",
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORDS = re.compile(r"[-_.\s]+")
_ASSIGN = re.compile(r"^(-{0,2}[A-Za-z_][\w.-]*)=(.*)$", re.S)
_OPTION = re.compile(r"--?[A-Za-z][\w.-]*")
_HEADER = re.compile(r"^(\s*[A-Za-z][\w-]*\s*:\s*)((?:bearer|basic|token|digest|negotiate)\s+)?(\S.*)$",
                     re.S | re.I)
_BEARER = re.compile(r"\b(bearer)\s+\S+", re.I)
# The lookbehind keeps this linear on a long run of letters; the password runs to the authority's last '@'.
_URL_CREDS = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):[^\s/]+@")
# A string literal given to a name in code (the program of ``python -c``, ``node -e``, ``perl -e``): ``token =
# "x"``, ``f(api_key='x')``, ``{"password": "x"}``, ``os.environ["HF_TOKEN"] = "x"``, ``export TOKEN="x"``.
# group 1: the key (bare, quoted, or a subscript's quoted key), 2: up to the value's opening quote, 3: the quote.
_CODE_LITERAL = re.compile(
    r"""(?:\[\s*)?["']?(?<![\w.-])([A-Za-z_][\w.-]{0,63})["']?(?:\s*\])?(\s*(?::|=|:=)\s*(?:[rRbBuUfF]{0,2}))"""
    r"""(["'])(?:\\.|(?!\3).){0,1024}\3""",
    re.S)  # bounded key and literal, keys tried at word starts only: linear in the argument's length


def _key_words(key: str) -> tuple[str, ...]:
    return tuple(w for w in _WORDS.split(_CAMEL.sub("-", key.lstrip("-")).lower()) if w)


@functools.lru_cache(maxsize=64)
def _pattern_words(patterns: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(_key_words(p) for p in patterns if _key_words(p))


def _is_secret_key(key: str, patterns: tuple[tuple[str, ...], ...]) -> bool:
    words = _key_words(key)
    return any(len(p) <= len(words) and words[-len(p):] == p for p in patterns)


def _scrub_free_text(arg: str, patterns: tuple[tuple[str, ...], ...]) -> str:
    """Redact URL passwords, secret ``Header: value`` pairs and ``Bearer`` tokens in one arg."""
    arg = _URL_CREDS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", arg)
    m = _HEADER.match(arg)
    if m and _is_secret_key(m.group(1).strip().rstrip(":").strip(), patterns):
        return f"{m.group(1)}{m.group(2) or ''}{REDACTED}"
    return _BEARER.sub(lambda b: f"{b.group(1)} {REDACTED}", arg)


def _scrub_code(arg: str, patterns: tuple[tuple[str, ...], ...]) -> str:
    """Redact the string literals that code in one argument gives to a secret name (:data:`_CODE_LITERAL`);
    the quotes stay, so the code still reads as code. Values that are not literals (``token = read()``) are
    code, not secrets, and stay."""
    def literal(m: re.Match[str]) -> str:
        if not _is_secret_key(m.group(1), patterns):
            return m.group(0)
        head = m.group(0)[:m.end(2) - m.start(0)]
        return f"{head}{m.group(3)}{REDACTED}{m.group(3)}"
    return _CODE_LITERAL.sub(literal, arg)


def redact_command_line(argv: Sequence[str], patterns: Sequence[str] = DEFAULT_REDACT_PATTERNS) -> list[str]:
    """Return ``argv`` with secret values replaced by :data:`REDACTED`, keys kept.

    Handled: ``--key=value``, ``--key value`` (the next arg is taken as the value unless it looks
    like an option itself, so boolean flags such as ``--use-auth-token`` do not eat the next
    option; a secret that starts with ``-`` and looks like an option is thus not redacted),
    ``KEY=value`` assignments (``HF_TOKEN=…``, ``wandb.api_key=…``), ``scheme://user:pass@host``
    (the password only), ``Authorization: Bearer x`` / ``X-Api-Key: x`` headers (scheme kept)
    and a bare ``Bearer x`` anywhere. An argument holding several words (the script of ``sh -c "tool
    --token x"``, ``bash -lc``, ``su -c``) is redacted word by word as well, and so is code in one
    (``python -c``, ``node -e``): a string literal given to a secret name (``token = "x"``,
    ``f(api_key='x')``, ``{"password": "x"}``, ``os.environ["HF_TOKEN"] = "x"``) keeps its quotes and loses
    its value. Keys match case-insensitively, see :data:`DEFAULT_REDACT_PATTERNS`. Not handled: a secret in
    code that is no literal given to such a name (``login("x")``), attached short options (``mysql
    -pSECRET``), ``-p``. Pure function; never raises for str input.
    """
    words = _pattern_words(tuple(patterns))
    return [" ".join(_redact_args(_scrub_code(arg, words).split(" "), words)) if " " in arg else arg
            for arg in _redact_args(argv, words)]


def _redact_args(argv: Sequence[str], words: tuple[tuple[str, ...], ...]) -> list[str]:
    out: list[str] = []
    pending = False
    for arg in argv:
        if pending and not _OPTION.fullmatch(arg.split("=", 1)[0]):
            out.append(REDACTED)
            pending = False
            continue
        pending = False
        m = _ASSIGN.match(arg)
        if m and m.group(2) and REDACTED not in m.group(2) and _is_secret_key(m.group(1), words):
            out.append(f"{m.group(1)}={REDACTED}")
        elif m:
            out.append(f"{m.group(1)}={_scrub_free_text(m.group(2), words)}")
        elif _OPTION.fullmatch(arg):
            pending = _is_secret_key(arg, words)
            out.append(arg)
        else:
            out.append(_scrub_free_text(arg, words))
    return out
