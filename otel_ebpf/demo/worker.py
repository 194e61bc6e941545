"""One node of the demo's simulated data-parallel job: a launcher and its rank processes.

::

    python -m otel_ebpf.demo.worker --node I --ranks R --nodes N --steps S --run-dir DIR --nccl LIB ...

The launcher (as torchrun on one node) starts R rank processes (this module again, with
``--local-rank``) with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE``/
``GROUP_RANK``/``MASTER_ADDR`` set, waits for them, writes ``DIR/node-I.status.json``
(``{"ranks": {global rank: exit code}}``) and exits 0 when every rank exited 0, else
:data:`RANKS_FAILED`.

A rank drives the REAL CUDA runtime (libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel;
without a GPU every call returns cudaErrorInsufficientDriver, 35, and is traced all the same)
and the stand-in libnccl.so.2 through ctypes, with the ABI of cuda_runtime_api.h and nccl.h:

* rank 0 calls ncclGetUniqueId and writes the 128 bytes to ``DIR/nccl-unique-id`` (a temporary
  name, then rename); the others wait for it (at most 30 s); ncclCommInitRank(world, id, rank);
* per step: cudaMemcpyAsync (the batch), a few cudaLaunchKernel, cudaStreamSynchronize,
  ncclAllReduce of the gradient bucket (2^20 float32, sum), every 4th step an ncclBroadcast,
  then a few ms of host "compute"; finally ncclCommDestroy.

The stand-in moves no data and never blocks, so the ranks meet at a file barrier in ``DIR``
after ncclCommInitRank and after every collective, as real NCCL ranks meet inside it: the
injected straggler's delay then shows as the others' wait, step after step, instead of
piling up. A barrier that waits :data:`WATCHDOG_S` (a rank died: ``--kill-rank`` SIGKILLs
that rank after step K, no ncclCommDestroy) ends like PyTorch's NCCL watchdog: ncclCommAbort,
a message naming the missing ranks, exit :data:`WATCHDOG_EXIT`.

Progress goes to stdout, one line each, for the demo runner: ``oe-demo up node=I host=H``,
``oe-demo step rank=G step=K``.
"""
from __future__ import annotations

import argparse
import ctypes as ct
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from otel_ebpf.demo.build import find_cudart

__all__ = ["RANKS_FAILED", "WATCHDOG_EXIT", "WATCHDOG_S", "main"]

RANKS_FAILED = 10  # launcher: at least one rank exited non-zero
WATCHDOG_EXIT = 3  # rank: a collective never completed (a peer is gone)
WATCHDOG_S = 6.0
ID_WAIT_S = 30.0
INIT_WAIT_S = 60.0  # every node's agent must be up: BPF compilation takes seconds per node
NCCL_FLOAT32, NCCL_SUM = 7, 0
GRAD_COUNT = 1 << 20
BROADCAST_COUNT = 1 << 16
BROADCAST_EVERY = 4
KERNELS_PER_STEP = 4
COMPUTE_S = 0.004
# A rank lingers this long after its last NCCL call before it exits. Why: every BPF receiver
# reports the exit, each from its own ring buffer, and the NCCL processor forgets a process's
# communicators at the first ProcessExit it sees; the CUDA receiver's can overtake the NCCL
# receiver's last records (each is read every poll_interval, 100 ms), and those calls then
# lose their join ids (seen on kernel 6.18: the last two collectives of the last rank).
EXIT_LINGER_S = 0.5
_H2D = 1


class UniqueId(ct.Structure):
    """ncclUniqueId: 128 bytes, passed BY VALUE to ncclCommInitRank (on the stack, SysV)."""

    _fields_ = [("internal", ct.c_char * 128)]


class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]


def _cudart() -> ct.CDLL:
    path = find_cudart()
    if path is None:
        raise SystemExit("otel-ebpf demo: nvidia-cuda-runtime-cu12 is not installed for this Python")
    rt = ct.CDLL(str(path))
    rt.cudaLaunchKernel.argtypes = [ct.c_void_p, Dim3, Dim3, ct.c_void_p, ct.c_size_t, ct.c_void_p]
    rt.cudaMemcpyAsync.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ct.c_void_p]
    rt.cudaSetDevice.argtypes = [ct.c_int]
    return rt


def _nccl(path: str) -> ct.CDLL:
    lib = ct.CDLL(path)
    comm_p = ct.c_void_p
    lib.ncclGetUniqueId.argtypes = [ct.POINTER(UniqueId)]
    lib.ncclCommInitRank.argtypes = [ct.POINTER(comm_p), ct.c_int, UniqueId, ct.c_int]
    lib.ncclAllReduce.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_int, comm_p, ct.c_void_p]
    lib.ncclBroadcast.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_int, comm_p, ct.c_void_p]
    lib.ncclCommDestroy.argtypes = [comm_p]
    lib.ncclCommAbort.argtypes = [comm_p]
    return lib


class Barrier:
    """Ranks meet by creating ``DIR/barrier/<tag>.<rank>`` and waiting for all ``world``."""

    def __init__(self, run_dir: Path, rank: int, world: int) -> None:
        self.dir = run_dir / "barrier"
        self.dir.mkdir(exist_ok=True)
        self.rank, self.world = rank, world

    def wait(self, tag: str, timeout_s: float) -> list[int]:
        """Ranks still missing after ``timeout_s`` (empty: everyone arrived)."""
        (self.dir / f"{tag}.{self.rank}").touch()
        deadline = time.monotonic() + timeout_s
        pending = [r for r in range(self.world) if r != self.rank]
        while pending:
            pending = [r for r in pending if not (self.dir / f"{tag}.{r}").exists()]
            if pending and time.monotonic() > deadline:
                return pending
            time.sleep(0.0005)
        return []


def _unique_id(nccl: ct.CDLL, run_dir: Path, rank: int) -> UniqueId:
    path = run_dir / "nccl-unique-id"
    if rank == 0:
        uid = UniqueId()
        _check("ncclGetUniqueId", nccl.ncclGetUniqueId(ct.byref(uid)))
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(bytes(uid))
        os.replace(tmp, path)  # readers never see half an id
        return uid
    deadline = time.monotonic() + ID_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: no NCCL unique id from rank 0 after {ID_WAIT_S:.0f}s")
        time.sleep(0.01)
    return UniqueId.from_buffer_copy(path.read_bytes())


def _say(line: str) -> None:
    """One progress line in ONE write(2): every rank of a node shares the pipe, and print()
    writes the text and its newline separately when stdout is unbuffered (lines interleave)."""
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def _check(what: str, rc: int) -> None:
    if rc != 0:
        raise SystemExit(f"{what} returned ncclResult_t {rc}")


class Rank:
    """One rank's job; see the module doc."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.rank = a.node * a.ranks + a.local_rank
        self.world = a.nodes * a.ranks
        self.rt, self.nccl = _cudart(), _nccl(a.nccl)
        self.barrier = Barrier(Path(a.run_dir), self.rank, self.world)
        self.comm = ct.c_void_p()
        self.grads = ct.create_string_buffer(GRAD_COUNT * 4)
        self.reduced = ct.create_string_buffer(GRAD_COUNT * 4)
        self.params = ct.create_string_buffer(BROADCAST_COUNT * 4)
        self.batch = ct.create_string_buffer(1 << 20)
        self.device_batch = ct.create_string_buffer(1 << 20)  # no GPU: a host address stands for one

    def init(self) -> None:
        self.rt.cudaSetDevice(self.a.local_rank)
        uid = _unique_id(self.nccl, Path(self.a.run_dir), self.rank)
        _check("ncclCommInitRank", self.nccl.ncclCommInitRank(ct.byref(self.comm), self.world, uid, self.rank))
        self._meet("init", INIT_WAIT_S)

    def _meet(self, tag: str, timeout_s: float) -> None:
        missing = self.barrier.wait(tag, timeout_s)
        if missing:
            print(f"rank {self.rank}: watchdog: '{tag}' did not complete in {timeout_s:.0f}s: ranks {missing} "
                  "never arrived; aborting the communicator", file=sys.stderr, flush=True)
            self.nccl.ncclCommAbort(self.comm)
            time.sleep(EXIT_LINGER_S)
            os._exit(WATCHDOG_EXIT)

    def _collective(self, tag: str, call: Callable[[], int]) -> None:
        if self.rank == self.a.straggler:
            if self.a.straggler_cause == "sleep":
                time.sleep(self.a.straggler_delay_ms / 1000)
            else:  # a longer compute phase: on-CPU, which the sched receiver tells from the peers' waiting
                end = time.monotonic() + self.a.straggler_delay_ms / 1000
                while time.monotonic() < end:
                    pass
        _check(tag, call())
        self._meet(tag, WATCHDOG_S)

    def step(self, k: int) -> None:
        rt, nccl, comm = self.rt, self.nccl, self.comm
        rt.cudaMemcpyAsync(self.device_batch, self.batch, len(self.batch), _H2D, None)
        kernel = ct.cast(rt.cudaLaunchKernel, ct.c_void_p)  # any host address stands for a kernel stub
        for i in range(KERNELS_PER_STEP):
            rt.cudaLaunchKernel(kernel, Dim3(128 + i, 1, 1), Dim3(256, 1, 1), None, 0, None)
        rt.cudaStreamSynchronize(None)
        self._collective(f"s{k}-allreduce", lambda: nccl.ncclAllReduce(
            self.grads, self.reduced, GRAD_COUNT, NCCL_FLOAT32, NCCL_SUM, comm, None))
        if k % BROADCAST_EVERY == 0:
            self._collective(f"s{k}-broadcast", lambda: nccl.ncclBroadcast(
                self.params, self.params, BROADCAST_COUNT, NCCL_FLOAT32, 0, comm, None))
        time.sleep(COMPUTE_S)
        _say(f"oe-demo step rank={self.rank} step={k}")

    def run(self) -> int:
        self.init()
        for k in range(1, self.a.steps + 1):
            self.step(k)
            if self.rank == self.a.kill_rank and k == self.a.kill_after_step:
                # It dies in the next step's compute (still no ncclCommDestroy), not right on the
                # heels of its last collective: see EXIT_LINGER_S, which would make that one look
                # unjoined by this rank too.
                time.sleep(EXIT_LINGER_S)
                print(f"rank {self.rank}: killing myself (SIGKILL) after step {k}, as asked", file=sys.stderr,
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        _check("ncclCommDestroy", self.nccl.ncclCommDestroy(self.comm))
        time.sleep(EXIT_LINGER_S)
        return 0


def _launch(a: argparse.Namespace, argv: Sequence[str]) -> int:
    _say(f"oe-demo up node={a.node} host={socket.gethostname()}")
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for local in range(a.ranks):
        rank = a.node * a.ranks + local
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(a.nodes * a.ranks),
               "LOCAL_WORLD_SIZE": str(a.ranks), "GROUP_RANK": str(a.node), "MASTER_ADDR": a.master_addr}
        procs[rank] = subprocess.Popen([sys.executable, "-m", "otel_ebpf.demo.worker", *argv,
                                        "--local-rank", str(local)], env=env)

    def stop(signum: int, _frame: object) -> None:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes: dict[int, int] = {}
    for rank, p in procs.items():
        try:
            codes[rank] = p.wait(timeout=a.deadline_s)
        except subprocess.TimeoutExpired:
            p.kill()
            codes[rank] = p.wait()
    status = Path(a.run_dir) / f"node-{a.node}.status.json"
    tmp = status.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ranks": codes}))
    os.replace(tmp, status)
    return 0 if all(c == 0 for c in codes.values()) else RANKS_FAILED


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m otel_ebpf.demo.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True, help="ranks per node")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--run-dir", required=True, help="directory shared by every rank (unique id, barriers)")
    p.add_argument("--nccl", required=True, help="path of the libnccl.so.2 to load")
    p.add_argument("--straggler", type=int, default=-1, help="global rank that is late to every collective")
    p.add_argument("--straggler-delay-ms", type=float, default=30.0)
    p.add_argument("--straggler-cause", choices=("cpu", "sleep"), default="cpu")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-after-step", type=int, default=-1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--deadline-s", type=float, default=600.0, help="launcher: longest wait for its ranks")
    p.add_argument("--local-rank", type=int, help=argparse.SUPPRESS)  # set by the launcher
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    a = _parser().parse_args(args)
    if a.local_rank is None:
        return _launch(a, args)
    return Rank(a).run()


if __name__ == "__main__":
    sys.exit(main())
