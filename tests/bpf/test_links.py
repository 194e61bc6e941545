"""otel_ebpf.bpf.links: uprobes attached as uprobe_multi links fire as BCC's do, detach on close, and a kernel
that refuses the links gets BCC's perf-event uprobes instead.

A child process calls NVIDIA's libcudart ``cudaGetDeviceCount`` (no GPU here: it returns an error, the probes
fire all the same) a known number of times, after a line on its stdin; the program counts its entries and
returns.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.bpf import links
from tests.support.uprobe_links import uprobe_links

pytestmark = pytest.mark.bpf

PROGRAM = r"""
BPF_ARRAY(hits, u64, 2);
static int count(int k) {
    if (bpf_get_current_pid_tgid() >> 32 != TARGET) return 0;
    u64 *v = hits.lookup(&k);
    if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
int on_entry(struct pt_regs *ctx) { return count(0); }
int on_return(struct pt_regs *ctx) { return count(1); }
"""
CALLER = ("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nn = ctypes.c_int()\n"
          "for line in sys.stdin:\n    for _ in range(int(line)):\n        lib.cudaGetDeviceCount(ctypes.byref(n))\n"
          "    print('done', flush=True)\n")
SYMBOL = "cudaGetDeviceCount"


class Caller:
    def __init__(self, cudart: Path) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", CALLER, str(cudart)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def calls(self, n: int) -> None:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(f"{n}\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "done"

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=30)


@pytest.fixture
def caller(cudart: Path) -> Iterator[Caller]:
    c = Caller(cudart)
    yield c
    c.close()


@pytest.fixture
def program(bpf_ready: None, caller: Caller) -> Iterator[object]:
    from bcc import BPF

    b = BPF(text=PROGRAM, cflags=[f"-DTARGET={caller.p.pid}"])
    yield b
    b.cleanup()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links on, as in a new process; restored after the test."""
    monkeypatch.setitem(links._state, "supported", True)


def _hits(b: object) -> list[int]:
    return [b["hits"][ct.c_int(i)].value for i in range(2)]  # type: ignore[index]


def _link_paths() -> list[str]:
    return [link.path for link in uprobe_links()]


def test_links_fire_like_uprobes_and_closing_detaches_them(program: object, caller: Caller, cudart: Path,
                                                            fresh: None) -> None:
    if not links.supported():
        pytest.fail("this kernel refused uprobe_multi links")
    ul = links.UprobeLinks(program)
    real = os.path.realpath(cudart)
    before = _link_paths().count(real)
    assert ul.attach(str(cudart), SYMBOL, "on_entry", ret=False)
    assert ul.attach(str(cudart), SYMBOL, "on_return", ret=True)
    assert len(ul) == 2 and _link_paths().count(real) == before + 2
    caller.calls(50)
    assert _hits(program) == [50, 50]
    ul.close()
    assert len(ul) == 0 and _link_paths().count(real) == before
    caller.calls(30)
    assert _hits(program) == [50, 50]  # detached: no more hits
    ul.close()  # twice: safe


def test_a_kernel_that_refuses_links_gets_bccs_uprobes(program: object, caller: Caller, cudart: Path,
                                                       fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[bool] = []

    def refuse(prog_fd: int, path: bytes, offset: int, ret: bool, ref_ctr_offset: int = 0) -> int:
        tried.append(ret)
        return -errno.EOPNOTSUPP  # a kernel without uprobe_multi links

    monkeypatch.setattr(links, "_link_create", refuse)
    ul = links.UprobeLinks(program)
    assert not ul.attach(str(cudart), SYMBOL, "on_entry", ret=False)
    assert not links.supported() and b"on_entry" not in program.funcs  # type: ignore[attr-defined]
    assert not ul.attach(str(cudart), SYMBOL, "on_return", ret=True)
    assert tried == [False]  # asked once: links stay off for the process
    program.attach_uprobe(name=str(cudart), sym=SYMBOL, fn_name="on_entry")  # type: ignore[attr-defined]
    program.attach_uretprobe(name=str(cudart), sym=SYMBOL, fn_name="on_return")  # type: ignore[attr-defined]
    caller.calls(20)
    assert _hits(program) == [20, 20] and len(ul) == 0


def test_a_function_bcc_already_probes_gets_a_bcc_uprobe_and_links_stay_on(
        program: object, caller: Caller, cudart: Path, fresh: None) -> None:
    """BCC's uprobe there carries a stray ref_ctr_offset (otel_ebpf.bpf.links): the kernel refuses a link at the
    same function with EINVAL, so this probe goes through BCC too, and links stay on for the others."""
    from bcc import BPF

    other = BPF(text="int other(struct pt_regs *ctx) { return 0; }")
    try:
        other.attach_uprobe(name=str(cudart), sym=SYMBOL, fn_name="other")
        ul = links.UprobeLinks(program)
        assert not ul.attach(str(cudart), SYMBOL, "on_entry", ret=False)
        assert links.supported() and len(ul) == 0
        program.attach_uprobe(name=str(cudart), sym=SYMBOL, fn_name="on_entry")  # type: ignore[attr-defined]
        assert ul.attach(str(cudart), "cudaGetLastError", "on_return", ret=True)  # another function: a link
        caller.calls(10)
        assert _hits(program)[0] == 10
        ul.close()
    finally:
        other.cleanup()


def test_one_probe_detaches_by_its_symbol_and_the_rest_stay(program: object, caller: Caller, cudart: Path,
                                                             fresh: None) -> None:
    ul = links.UprobeLinks(program)
    assert ul.attach(str(cudart), SYMBOL, "on_entry", ret=False)
    assert ul.attach(str(cudart), SYMBOL, "on_return", ret=True)
    assert ul.detach(str(cudart), SYMBOL, ret=False) and not ul.detach(str(cudart), SYMBOL, ret=False)
    assert len(ul) == 1
    caller.calls(5)
    assert _hits(program) == [0, 5]
    ul.close()


def test_links_are_tried_from_linux_6_6() -> None:
    assert [links._kernel_has_links(r) for r in ("6.18.0-cloud", "6.6.1", "6.5.13-generic", "5.15.0-91-generic",
                                                 "7.0", "garbage")] == [True, True, False, False, True, False]


def test_other_refusals_raise_naming_the_probe_and_leave_links_on(program: object, cudart: Path, fresh: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(links, "_link_create", lambda *a: -errno.EPERM)
    ul = links.UprobeLinks(program)
    with pytest.raises(OSError, match=rf"uprobe link on {cudart}:{SYMBOL}: Operation not permitted"):
        ul.attach(str(cudart), SYMBOL, "on_entry", ret=False)
    assert links.supported() and b"on_entry" not in program.funcs  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="could not determine address of symbol"):  # BCC's own error
        ul.attach(str(cudart), "noSuchCudaFunction", "on_entry", ret=False)
