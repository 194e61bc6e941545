"""Docs that cannot drift from behaviour: what README.md and docs/*.md show is checked against the code.

* Commands: every ``otel-ebpf ...`` (also ``.venv/bin/otel-ebpf``, ``sudo ...``, ``python -m otel_ebpf``)
  in a shell code block or an inline code span is parsed by the REAL argument parser (the one
  ``otel_ebpf.cli`` builds). Placeholders (``DIR``, ``<loop>``, ``[--output DIR]``, ``grpc|http``) are
  filled in: a number option gets 1, a choice its first value; optional groups are kept. Prose naming
  a subcommand alone (```otel-ebpf report` lists ...``) is checked for the name only. Each subcommand runs
  ``--help`` once through the installed console script, and each is shown somewhere in the docs.
* Config: every ``yaml`` block loads with the real agent (``otel_ebpf.service.settings``) or gateway
  (``otel_ebpf.gateway.config``) loader, so it validates (a ``receivers.probes`` example, whose libraries
  are another host's, with ``check_targets: false``). A block right after a line naming ``config
  --defaults`` shows defaults: each value must equal the real default (``otel-ebpf config --defaults`` /
  ``gateway --defaults``, loaded by the same loader, so ``10s`` equals ``10.0``). In any block, a
  commented-out key (``# resource_labels: [...]``) shows its default and is checked the same way. A block
  whose info string has a second word (```` ```yaml otelcol ````) is not ours and is skipped.
* Names: every ``otel_ebpf.X.Y`` resolves to a module or attribute, or is a name the code emits (a
  metric, scope or event name, as a whole string literal in otel_ebpf/). Every config key path in an
  inline code span (``service.pause_timeout``; ``<id>`` or ``*`` match any key, ``[i]`` a list element)
  exists in the agent's or the gateway's typed defaults, or is a name in the package
  (``processors.python.call_ids``), or is a key the paragraph says moved that exists under another
  component. Every ``OTEL_EBPF_*`` variable is used by otel_ebpf/, scripts/ or bench/, or read by a test.

``test_the_checks_report_drift`` feeds each check a wrong command, key, default, name and variable.
The readers live in tests/support/doc_commands.py and doc_config.py.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.doc_commands import Doc, build_parser, command_problems, load_docs, otel_ebpf_command, subcommands
from tests.support.doc_config import Loader, env_problems, key_problems, make_loaders, name_problems, yaml_problems


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return load_docs()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.fixture(scope="module")
def tmp() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture(scope="module")
def loaders(tmp: str) -> list[Loader]:
    return make_loaders(tmp)


def test_every_command_in_the_docs_parses(docs: list[Doc], parser: argparse.ArgumentParser) -> None:
    used: set[str] = set()
    assert command_problems(docs, parser, used) == []
    assert sorted(set(subcommands(parser)) - used) == [], "subcommands no doc shows"


def test_every_subcommand_help_runs(parser: argparse.ArgumentParser, tmp: str) -> None:
    def help_of(sub: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        return sub, subprocess.run([*otel_ebpf_command(), sub, "--help"], capture_output=True, text=True,
                                   timeout=60, cwd=tmp)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(help_of, subcommands(parser)))
    bad = {sub: r.stderr[-300:] for sub, r in results
           if r.returncode != 0 or not r.stdout.startswith(f"usage: otel-ebpf {sub}")}
    assert bad == {}


def test_every_yaml_config_block_loads_and_shows_the_real_defaults(docs: list[Doc], loaders: list[Loader],
                                                                  tmp: str) -> None:
    assert yaml_problems(docs, loaders, tmp) == []


def test_every_config_key_path_exists(docs: list[Doc], loaders: list[Loader]) -> None:
    assert key_problems(docs, loaders) == []


def test_every_otel_ebpf_name_resolves(docs: list[Doc]) -> None:
    assert name_problems(docs) == []


def test_every_environment_variable_is_read_by_the_code(docs: list[Doc]) -> None:
    assert env_problems(docs) == []


BAD_DOC = """# drift
Run `otel-ebpf run --no-such-flag -- true`, then `otel-ebpf run --log-level loud -- true`.

```sh
.venv/bin/otel-ebpf check
sudo python -m otel_ebpf demo --nodes two
otel-ebpf config --defaults > x.yaml && otel-ebpf frobnicate
```

Config (`otel-ebpf config --defaults` prints it):

```yaml
receivers:
  nvml:
    interval: 5s
    # event_wait: 2s
```

```yaml
receivers:
  nvml:
    intervall: 10s
```

See `receivers.sched.no_such_key`, `service.no_such_key`, `otel_ebpf.no_such_module.thing`,
`otel_ebpf.Nothing` and `OTEL_EBPF_NO_SUCH_VARIABLE`.

`receivers.nvml.no_such_key` moved to `receivers.cuda.no_such_key`. `otel-ebpf reprot` lists them.
"""

GOOD_DOC = """# no drift
`otel-ebpf run --pid <loop>`, `sudo .venv/bin/otel-ebpf twin --nodes M [--output DIR] -- train.py`,
`otel-ebpf run --otlp-endpoint URL [--otlp-protocol grpc|http] -- CMD`, `python -m otel_ebpf check`.

Config (`otel-ebpf config --defaults` prints it):

```yaml
receivers:
  nvml:
    interval: 10s
    # event_wait: 500ms
```

See `receivers.nvml.interval`, `service.pipelines.<p>.receivers[i]`, `exporters.otlp/backup.endpoint`,
`service.name`, `otel_ebpf.TargetError`, `otel_ebpf.receivers.<name>.events`, `otel_ebpf.events.dropped`
and `OTEL_EBPF_CONFIG`.

`receivers.nvml.libraries` moved: it is now `receivers.cuda.libraries`. `otel-ebpf report` lists them.
"""


def test_the_checks_report_drift(parser: argparse.ArgumentParser, loaders: list[Loader], tmp: str) -> None:
    bad, good = [Doc("bad.md", BAD_DOC)], [Doc("good.md", GOOD_DOC)]
    commands = command_problems(bad, parser)
    assert [p.split(": ")[0] for p in commands] == ["bad.md:2", "bad.md:2", "bad.md:6", "bad.md:7", "bad.md:28"]
    assert "unrecognized arguments: --no-such-flag" in commands[0] and "invalid choice: 'loud'" in commands[1]
    assert "invalid int value: 'two'" in commands[2] and "invalid choice: 'frobnicate'" in commands[3]
    assert commands[4] == "bad.md:28: 'otel-ebpf reprot': no subcommand 'reprot'"
    configs = yaml_problems(bad, loaders, tmp)
    assert configs[0].startswith("bad.md:15: receivers.nvml.interval (a defaults block) shows 5.0; the real "
                                 "default is 10.0"), configs
    assert configs[1].startswith("bad.md:16: receivers.nvml.event_wait (commented out: its default) shows 2.0")
    assert configs[2].startswith("bad.md:20: the config block does not load") and "intervall" in configs[2]
    assert len(configs) == 3, configs
    assert [p.split(" is ")[0] for p in key_problems(bad, loaders)] == [
        "bad.md:25: config key receivers.sched.no_such_key", "bad.md:25: config key service.no_such_key",
        "bad.md:28: config key receivers.nvml.no_such_key", "bad.md:28: config key receivers.cuda.no_such_key"]
    assert [p.split(" is ")[0] for p in name_problems(bad)] == [
        "bad.md:25: otel_ebpf.no_such_module.thing", "bad.md:26: otel_ebpf.Nothing"]
    assert env_problems(bad) == ["bad.md:26: OTEL_EBPF_NO_SUCH_VARIABLE is read nowhere in the code"]
    assert command_problems(good, parser) == []
    assert yaml_problems(good, loaders, tmp) == []
    assert key_problems(good, loaders) == [] and name_problems(good) == [] and env_problems(good) == []
