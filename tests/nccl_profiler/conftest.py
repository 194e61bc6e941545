"""Fixtures for the NCCL profiler plugin's tests: the plugin as setup.py built it (otel_ebpf.nccl_profiler), the
NCCL 2.28.9 model that drives it (driver.c + nccl_sim.c) and a user's plugin to chain (counting_plugin.c), both
built here with gcc into temporary folders, and :class:`Driver`, a running driver process."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf import nccl_profiler

HERE = Path(__file__).resolve().parent
ABI_DIR = Path(nccl_profiler.__file__).resolve().parent  # nccl/profiler.h, probes.h
COUNTING = "libnccl-profiler-counting.so"
NARROW = 0x100  # ncclProfileGroupApi
# GroupApi | CollApi | P2pApi | Group | Coll | P2p | KernelCh (probes.h)
WIDE = 0x100 | 0x200 | 0x400 | 0x1 | 0x2 | 0x4 | 0x40


def build_c(out: Path, sources: list[str], *flags: str, shared: bool = False) -> Path:
    """tests/nccl_profiler/SOURCES built with gcc -O1 -g -Wall -Wextra -Werror against the plugin's ABI headers."""
    lib = ["-fPIC", "-shared"] if shared else []
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{ABI_DIR}", *lib, *flags, "-o", str(out),
                    *(str(HERE / s) for s in sources), "-ldl", "-lpthread"],
                   check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="session")
def plugin() -> Path:
    """The plugin setup.py built (pip install -e . in scripts/setup.sh): what ships, not a test build."""
    return nccl_profiler.require_plugin()


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory.mktemp("driver") / "driver", ["driver.c", "nccl_sim.c"])


@pytest.fixture(scope="session")
def counting_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding libnccl-profiler-counting.so (put it on LD_LIBRARY_PATH to resolve it by name)."""
    out = tmp_path_factory.mktemp("counting")
    build_c(out / COUNTING, ["counting_plugin.c"], shared=True)
    return out


class Driver:
    """A running driver (driver.c): commands in, JSON lines out. Every read is bounded (``timeout`` s)."""

    def __init__(self, exe: Path, plugin: Path | None, version: int, env: Mapping[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_EBPF_NCCL", "COUNTING_"))}
        full.update(env or {})
        self.timeout = timeout
        self.proc = subprocess.Popen([str(exe), str(plugin) if plugin else "none", str(version)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=full)
        self.trace: list[dict[str, Any]] = []
        self._lines: queue.Queue[str] = queue.Queue()  # a reader thread: select() misses lines Python buffered
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._line()
        assert "ready" in ready, ready
        self.pid: int = ready["ready"]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _line(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            raise AssertionError(f"driver silent for {self.timeout}s; trace so far: {self.trace[-5:]}") from None
        if not line:
            raise AssertionError(f"driver exited ({self.proc.wait(5)}): {self.stderr()}")
        return dict(json.loads(line))

    def run(self, command: str) -> tuple[int, list[dict[str, Any]]]:
        """Send one command; returns NCCL's mask after it and the plugin calls it made."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        calls: list[dict[str, Any]] = []
        while True:
            msg = self._line()
            if "done" in msg:
                self.trace += calls
                return int(msg["mask"]), calls
            assert "error" not in msg, msg
            calls.append(msg)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> str:
        """Quit; returns everything the driver wrote to stderr (NCCL's log lines: "NCCLLOG <level> <text>")."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.stderr()


@pytest.fixture
def run_driver(driver: Path) -> Iterator[Any]:
    """Starts drivers (``run_driver(plugin, version, env)``) and quits the ones a test left running."""
    started: list[Driver] = []

    def start(plugin: Path | None, version: int = 5, env: Mapping[str, str] | None = None) -> Driver:
        d = Driver(driver, plugin, version, env)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(5)
