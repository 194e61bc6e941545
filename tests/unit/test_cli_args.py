"""Options the ``otel-ebpf`` parser accepts where a user puts them (issue 18)."""
from __future__ import annotations

import pytest

from otel_ebpf import cli


def test_log_level_after_the_subcommand() -> None:
    args = cli._parser().parse_args(["run", "--log-level", "info", "--", "true"])
    assert args.log_level == "info" and args.command == ["--", "true"]


def test_log_level_before_the_subcommand_still_works() -> None:
    args = cli._parser().parse_args(["--log-level", "debug", "run", "--", "true"])
    assert args.log_level == "debug"


def test_the_one_after_the_subcommand_wins() -> None:
    args = cli._parser().parse_args(["--log-level", "debug", "gateway", "--log-level", "error"])
    assert args.log_level == "error"


def test_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EBPF_LOG_LEVEL", "info")
    assert cli._parser().parse_args(["check"]).log_level == "info"
    monkeypatch.delenv("OTEL_EBPF_LOG_LEVEL")
    assert cli._parser().parse_args(["check"]).log_level == "warning"


@pytest.mark.parametrize("argv", [["run", "--log-level", "loud", "--", "true"], ["--log-level", "loud", "check"]])
def test_an_unknown_level_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli._parser().parse_args(argv)
    assert exc.value.code == 2 and "loud" in capsys.readouterr().err


def test_command_after_double_dash_keeps_its_own_log_level_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EBPF_LOG_LEVEL", raising=False)
    args = cli._parser().parse_args(["run", "--", "prog", "--log-level", "x"])
    assert args.command == ["--", "prog", "--log-level", "x"] and args.log_level == "warning"
