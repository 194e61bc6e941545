"""The block IO receiver's real tracepoints: a traced child writes N MiB with O_DIRECT|O_SYNC to
a file on a real block device (the test directory's; where that is tmpfs or overlay, an ext4
loop device the test creates and removes) and the bytes attributed to its pid match; the
device's latency histogram has the requests. And IO the kernel inserts and issues from a kworker
(ext4 fast commits: data writes with a preflush, run by the flush machinery in kblockd) still
counts for the process that submitted it. Every wait is bounded."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.blockio import BlockIoProcessor
from otel_ebpf.processors.blockio import Config as ProcessorConfig
from otel_ebpf.receivers.blockio import Config, create
from otel_ebpf.receivers.blockio.events import DiskIoStats, ProcessDiskIo
from otel_ebpf.receivers.blockio.receiver import device_name

pytestmark = pytest.mark.bpf

MIB = 1 << 20
WRITE_MIB = 8
WRITER = f"""
import mmap, os, sys
path = sys.argv[1]
sys.stdin.readline()
buf = mmap.mmap(-1, {MIB})  # page-aligned, as O_DIRECT needs
buf.write(b"x" * {MIB})
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_SYNC, 0o600)
for _ in range({WRITE_MIB}):
    os.write(fd, buf)
os.close(fd)
print("written", flush=True)
"""


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _block_device(path: Path) -> str | None:
    """The kernel name of the block device holding ``path``, or None (tmpfs, overlay...)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0 or not Path(f"/sys/dev/block/{major}:{minor}").exists():
        return None
    return device_name(major << 20 | minor)


@contextlib.contextmanager
def _loop_fs(work: Path, mkfs_options: tuple[str, ...] = ()) -> Iterator[Path]:
    """An ext4 file system (``mkfs.ext4 mkfs_options``) on a loop device over a file in ``work``,
    mounted; all removed after."""
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed to make a block device for the test (the test dir is not on one)")
    image, mnt = work / "disk.img", work / "mnt"
    with open(image, "wb") as fh:
        fh.truncate(64 * MIB)
    mnt.mkdir()
    loop = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                          text=True, timeout=30).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs_options, loop], check=True, capture_output=True, timeout=60)
        subprocess.run(["mount", loop, str(mnt)], check=True, capture_output=True, timeout=30)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False, capture_output=True, timeout=30)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def _target_dir(tmp_path: Path, force_loop: bool) -> Iterator[tuple[Path, str]]:
    dev = None if force_loop else _block_device(tmp_path)
    if dev is not None:
        yield tmp_path, dev
        return
    with _loop_fs(tmp_path) as mnt:
        name = _block_device(mnt)
        assert name is not None and name.startswith("loop"), name
        yield mnt, name


def _run_writer(directory: Path, writer: str = WRITER) -> tuple[int, ListConsumer, Context]:
    proc = subprocess.Popen([sys.executable, "-c", writer, str(directory / "data.bin")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ctx = Context(target_pids=[proc.pid])
    sink = ListConsumer()
    receiver = create(Config(interval=0.1), ctx, sink)
    try:
        receiver.start()
        out, _ = proc.communicate("go\n", timeout=60)
        assert out.strip() == "written"
        time.sleep(0.3)  # two reads of the maps
    finally:
        receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc.pid, sink, ctx


@pytest.mark.parametrize("force_loop", [False, True], ids=["test_dir_device", "loop_device"])
def test_direct_io_writes_are_attributed_to_the_writer(bpf_ready: None, tmp_path: Path, force_loop: bool) -> None:
    if force_loop and not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices on this host (/dev/loop-control)")
    with _target_dir(tmp_path, force_loop) as (directory, dev):
        pid, sink, ctx = _run_writer(directory)
    mine = [e for e in sink.events if isinstance(e, ProcessDiskIo) and e.pid == pid]
    written = sum(e.bytes for e in mine if e.op == "write" and e.device == dev)
    # the data itself; O_SYNC on a new file adds some metadata/journal writes of its own
    assert WRITE_MIB * MIB <= written <= WRITE_MIB * MIB + 2 * MIB, (written, mine)
    assert sum(e.ns for e in mine if e.op == "write") > 0
    # nothing is attributed to processes that are not traced
    assert {e.pid for e in sink.events if isinstance(e, ProcessDiskIo)} == {pid}
    stats = [e for e in sink.events if isinstance(e, DiskIoStats) and e.device == dev and e.op == "write"]
    assert sum(e.bytes for e in stats) >= written
    assert sum(e.ops for e in stats) == sum(n for e in stats for _, n in e.buckets) > 0
    # and the processor turns them into semconv metrics
    out = ListConsumer()
    BlockIoProcessor(ProcessorConfig(), ctx, out).consume(sink.events)
    proc_io = [m for m in out.events if isinstance(m, MetricRecord) and m.name == "process.disk.io"
               and m.pid == pid and m.attributes.get("disk.io.direction") == "write"]
    assert sum(m.value for m in proc_io) == written
    hist = [m for m in out.events if isinstance(m, MetricRecord) and m.name == "system.disk.operation.duration"
            and m.attributes["system.device"] == dev]
    assert sum(m.count for m in hist) >= len(mine)


FSYNCS = 32
FSYNC_WRITER = f"""
import os, sys
path = sys.argv[1]
sys.stdin.readline()
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
for _ in range({FSYNCS}):
    os.write(fd, b"y" * 4096)
    os.fsync(fd)
os.close(fd)
print("written", flush=True)
"""


def test_writes_issued_from_a_kworker_count_for_their_submitter(bpf_ready: None, tmp_path: Path) -> None:
    """Each fsync of a small append on ext4 with fast_commit writes the data block (issued by the
    writer) and a fast-commit block with REQ_PREFLUSH|REQ_FUA. A loop device has a write cache,
    so the kernel's flush machinery (block/blk-flush.c) runs the latter: the writer allocates the
    request (block_getrq), kblockd inserts and issues it. Both count for the writer: about two
    writes per fsync (keyed at insert/issue, only the data blocks did: about one per fsync)."""
    if not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices on this host (/dev/loop-control)")
    # no lazy init: ext4lazyinit would write the inode tables from a kthread meanwhile
    options = ("-O", "fast_commit", "-E", "lazy_itable_init=0,lazy_journal_init=0")
    with _loop_fs(tmp_path, options) as mnt:
        dev = _block_device(mnt)
        pid, sink, _ = _run_writer(mnt, FSYNC_WRITER)
    mine = [e for e in sink.events if isinstance(e, ProcessDiskIo) and e.pid == pid
            and e.device == dev and e.op == "write"]
    ops = sum(e.ops for e in mine)
    # the first fsyncs of a new file may need a full (jbd2) commit instead of a fast one
    assert ops >= 2 * FSYNCS - 4, (ops, sum(e.bytes for e in mine), mine)
