"""otel_ebpf.bpf.loader: a BPF program load interrupted by a pending signal (EAGAIN) is tried again."""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable

import pytest

from otel_ebpf.bpf.loader import LOAD_ATTEMPTS, retry_interrupted_load

# what BCC's BPF.load_func raises when bpf(BPF_PROG_LOAD) fails (os.strerror of the errno)
EAGAIN = Exception(f"Failed to load BPF program b'enter_cudaMalloc': {os.strerror(errno.EAGAIN)}")


def _failing(times: int, exc: Exception) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return "loaded"
    return calls, load


def test_an_interrupted_load_is_tried_again_and_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    calls, load = _failing(LOAD_ATTEMPTS - 1, EAGAIN)
    with caplog.at_level(logging.DEBUG, logger="otel_ebpf.bpf.loader"):
        assert retry_interrupted_load(load, "cuda") == "loaded"
    assert len(calls) == LOAD_ATTEMPTS
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * (LOAD_ATTEMPTS - 1)
    assert "cuda" in caplog.records[0].getMessage() and "EAGAIN" in caplog.records[0].getMessage()


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    calls, load = _failing(LOAD_ATTEMPTS, EAGAIN)
    with pytest.raises(Exception, match="Resource temporarily unavailable"):
        retry_interrupted_load(load, "cuda")
    assert len(calls) == LOAD_ATTEMPTS
    calls, load = _failing(1, OSError(errno.EAGAIN, "again"))
    assert retry_interrupted_load(load, "cuda") == "loaded"


def test_other_failures_are_not_retried() -> None:
    calls, load = _failing(1, Exception(f"Failed to load BPF program b'f': {os.strerror(errno.EACCES)}"))
    with pytest.raises(Exception, match=os.strerror(errno.EACCES)):
        retry_interrupted_load(load, "cuda")
    assert len(calls) == 1
