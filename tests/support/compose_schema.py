"""The compose-spec JSON schema, from an official package fetched at set-up time, never vendored.

Source: Docker's ``docker-compose`` 1.29.2 wheel on PyPI (the last Python release of Compose)
ships the Compose Specification schema as ``compose/config/compose_spec.json`` (draft 2019-09).
Newer copies live only in GitHub and in the Go module ``github.com/compose-spec/compose-go``,
whose proxy this project's CI cannot reach; no package of the compose-spec or docker
organisation on npm carries the file. The wheel is only downloaded (``pip download --no-deps``),
never installed: it pins PyYAML < 6.

``python -m tests.support.compose_schema --fetch`` (run by scripts/setup.sh with the test extra)
downloads the wheel into ``tests/support/build/schemas/`` (git-ignored); :func:`load` reads the
schema straight out of it.

What the 2021 schema lacks: the top-level ``name`` (project name), added to the specification
later (compose-spec ``04-version-and-name.md``). :func:`validate` checks ``name`` separately, with
Compose's project-name rule, and validates the rest against the packaged schema unchanged. The
schema's ``format`` keywords (``duration``, ``ports``, ``expose``) are Compose's own and are not
checked (jsonschema has no checker for them).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["CACHE", "MEMBER", "REQUIREMENT", "fetch", "load", "validate", "wheel"]

REQUIREMENT = "docker-compose==1.29.2"
MEMBER = "compose/config/compose_spec.json"
CACHE = Path(__file__).resolve().parent / "build" / "schemas"
# Compose's rule for project names (docker compose rejects others): lowercase letters, digits,
# dashes and underscores, starting with a letter or a digit.
_PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def wheel(cache: Path = CACHE) -> Path | None:
    """The downloaded wheel, or None when ``--fetch`` has not run."""
    found = sorted(cache.glob("docker_compose-1.29.2-*.whl"))
    return found[-1] if found else None


def fetch(cache: Path = CACHE) -> Path:
    """Download the wheel (no dependencies, no install) unless present; return its path.

    Blocks on the network; raises ``RuntimeError`` naming pip's output when the download fails.
    """
    have = wheel(cache)
    if have is not None:
        return have
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--dest", str(cache), REQUIREMENT]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    have = wheel(cache)
    if r.returncode != 0 or have is None:
        raise RuntimeError(f"pip download {REQUIREMENT} into {cache} failed: {r.stderr.strip()[-2000:]}")
    load(have)  # fail now, not in the tests, if the wheel lacks the schema
    return have


def load(path: Path | None = None) -> dict[str, Any] | None:
    """The schema as a dict, or None when the wheel is not downloaded."""
    path = path or wheel()
    if path is None:
        return None
    with zipfile.ZipFile(path) as zf:
        try:
            data = zf.read(MEMBER)
        except KeyError:
            raise RuntimeError(f"{path} has no {MEMBER}") from None
    schema = json.loads(data)
    if not isinstance(schema, dict) or "definitions" not in schema:
        raise RuntimeError(f"{path}!{MEMBER} is not the compose-spec schema")
    return schema


def _where(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def validate(doc: Any, schema: dict[str, Any]) -> list[str]:
    """Findings (``services.agent.cap_add[0]: message``) for a parsed compose file."""
    from jsonschema import Draft201909Validator

    if not isinstance(doc, dict):
        return [f"(top level): a compose file must be a mapping, got {type(doc).__name__}"]
    out = []
    rest = dict(doc)
    if "name" in rest:
        name = rest.pop("name")
        if not isinstance(name, str) or not _PROJECT_NAME.match(name):
            out.append(f"name: {name!r} is not a valid project name ({_PROJECT_NAME.pattern})")
    # draft 2019-09 explicitly: the schema's "$schema" URI ends in "#", which jsonschema does not map.
    validator = Draft201909Validator(schema)
    for err in sorted(validator.iter_errors(rest), key=lambda e: list(map(str, e.absolute_path))):
        out.append(f"{_where(err.absolute_path)}: {err.message}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help=f"download {REQUIREMENT} into {CACHE}")
    args = parser.parse_args(argv)
    if args.fetch:
        try:
            print(fetch())
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"compose schema: {e}", file=sys.stderr)
            return 1
        return 0
    print(wheel() or "not fetched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
