"""Every ``otel-ebpf`` subcommand's ``--help`` ends with worked examples of the same command."""
from __future__ import annotations

import argparse

import pytest

from otel_ebpf.cli import _parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_top_level_help_has_an_example_for_the_main_commands() -> None:
    text = _parser().format_help()
    assert "examples:" in text
    for cmd in ("check", "run", "config", "gateway", "demo"):
        assert f"otel-ebpf {cmd}" in text


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_subcommand_help_has_examples_of_itself(name: str) -> None:
    text = subcommands()[name].format_help()
    examples = text.split("examples:", 1)
    assert len(examples) == 2, f"'otel-ebpf {name} --help' has no examples section"
    assert f"otel-ebpf {name}" in examples[1]
