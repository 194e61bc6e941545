"""The demo's training job: FSDP2 + tensor parallel on a 2-D DeviceMesh, plain PyTorch.

::

    torchrun --nnodes M --nproc-per-node G ... train.py --steps N [--straggler R --straggler-delay-ms D
             --straggler-cause cpu|sleep] [--kill-rank K --kill-after-step S] [--tp T] [--timeout-s T]

A small MLP (``BLOCKS`` blocks of Linear-ReLU-Linear) trained with AdamW over a DeviceMesh ``("dp", "tp")`` of
``(WORLD_SIZE / T, T)`` ranks, T = the ranks per node by default (TorchTitan's layout: tensor parallel inside a
node, data parallel across nodes). Each block is split by ``parallelize_module`` (column-wise, then row-wise:
an all-reduce on ``tp`` in forward and backward), then sharded by FSDP2's ``fully_shard`` on ``dp`` (per-block
all-gathers and reduce-scatters); every step ends with the loss averaged over the world (an all-reduce). So the
job uses three kinds of communicators: the world, one per ``dp`` group, one per ``tp`` group.

Run on the twin (otel_ebpf.twin: simulated GPUs) the kernels do nothing, so the loss is meaningless, but every
collective torch issues is real and moves real data. It imports only torch and the standard library: it runs in
the twin's environment, where otel_ebpf's own dependencies are not installed.

Options for the demo:

* ``--straggler R``: global rank R spends ``--straggler-delay-ms`` before each step's collectives, busy on the
  CPU (``cpu``) or asleep (``sleep``).
* ``--kill-rank K --kill-after-step S``: rank K SIGKILLs itself after step S (no clean-up, as a crash).
* ``--timeout-s``: the process group's timeout. A step that takes longer (a peer is gone) aborts this rank's
  communicators and exits :data:`TIMEOUT_EXIT`; so does SIGTERM from torchrun, which stops the job when one of
  its ranks failed. (Torch's own watchdog acts too, on the twin as on a GPU: a dead peer on another node is
  ncclRemoteError from ncclCommGetAsyncError, and it tears the rank down. A dead peer on the same node, or a
  hang, it sees only at the process group's timeout, and the main thread, blocked in a stream
  synchronisation, runs no Python signal handler: hence this bound of the demo's own.)

Output: one line per finished step on stdout, ``oe-demo step rank=<global rank> step=<k>`` (k = 1..N); with
``OTEL_EBPF_DEMO_DIR`` set, ``$OTEL_EBPF_DEMO_DIR/comms-rank<r>.json``: the groups this rank uses, a list of
``{"name", "members" (global ranks), "rank" (this rank's rank in it), "size"}``. Exit 0 when every step ran.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

BLOCKS, WIDTH, BATCH = 3, 64, 8
TIMEOUT_EXIT = 3  # a step did not finish in --timeout-s, or torchrun stopped the job
# A rank lingers this long after its last NCCL call before it exits or kills itself: an eBPF agent reads each
# receiver's records every 100 ms, and a process exit seen before its last calls' records would orphan them.
EXIT_LINGER_S = 0.5


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--straggler", type=int, default=-1, help="global rank that is late to every step (-1: none)")
    p.add_argument("--straggler-delay-ms", type=float, default=30.0)
    p.add_argument("--straggler-cause", choices=("cpu", "sleep"), default="cpu")
    p.add_argument("--kill-rank", type=int, default=-1, help="global rank that SIGKILLs itself (-1: none)")
    p.add_argument("--kill-after-step", type=int, default=-1)
    p.add_argument("--tp", type=int, default=0, help="tensor-parallel degree (default: the ranks per node)")
    p.add_argument("--timeout-s", type=float, default=15.0, help="process group timeout, seconds")
    return p.parse_args(argv)


def say(line: str) -> None:
    """One line in ONE write(2): the node's ranks share torchrun's stdout."""
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def tp_degree(requested: int, world: int, per_node: int) -> int:
    """``--tp``, else the ranks per node on several nodes, else 2 (1 when the world is odd)."""
    tp = requested or (per_node if per_node < world else (2 if world % 2 == 0 else 1))
    if world % tp:
        raise SystemExit(f"train.py: --tp {tp} does not divide the world size {world}")
    return tp


def build_model(mesh: DeviceMesh, device: torch.device) -> nn.Sequential:
    """Blocks split across ``tp`` (column- then row-wise), each then sharded across ``dp``, and the root."""
    model = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Linear(4 * WIDTH, WIDTH))
                            for _ in range(BLOCKS))).to(device)
    for block in model:
        parallelize_module(block, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def write_comms(mesh: DeviceMesh, rank: int) -> None:
    """``$OTEL_EBPF_DEMO_DIR/comms-rank<rank>.json``: torch's own view of each group this rank uses."""
    out = os.environ.get("OTEL_EBPF_DEMO_DIR")
    if not out:
        return
    groups = [("world", dist.group.WORLD), ("dp", mesh.get_group("dp")), ("tp", mesh.get_group("tp"))]
    comms = [{"name": name, "members": dist.get_process_group_ranks(g), "rank": dist.get_rank(g),
              "size": dist.get_world_size(g)} for name, g in groups]
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"comms-rank{rank}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(comms))
    os.replace(tmp, path)  # readers never see half a file


class Watchdog(threading.Thread):
    """Ends a rank whose step hangs: a step running longer than ``timeout`` seconds, or SIGTERM (torchrun
    stopping the job), aborts every communicator, so that a collective waiting for a dead peer returns an
    error to the main thread; if the main thread has not exited ``timeout`` seconds later, exits the process.

    SIGTERM is seen through ``signal.set_wakeup_fd``: a Python signal handler runs only when the main thread
    leaves the CUDA call (a stream synchronisation waiting for a collective) it may be blocked in. Create it in
    the main thread."""

    def __init__(self, rank: int, timeout: float) -> None:
        super().__init__(name="oe-demo-watchdog", daemon=True)
        self.rank, self.timeout = rank, timeout
        self.step, self.deadline = 0, float("inf")
        self.fired = ""
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, lambda *_: None)  # kept from killing us: the watchdog ends the rank

    def arm(self, step: int) -> None:
        self.step, self.deadline = step, time.monotonic() + self.timeout

    def run(self) -> None:
        while not self.fired:
            ready, _, _ = select.select([self._wake_r], [], [], 0.2)
            if ready and signal.SIGTERM in os.read(self._wake_r, 64):
                self.fired = "the launcher stopped the job (SIGTERM: another rank failed)"
            elif time.monotonic() > self.deadline:
                self.fired = f"step {self.step} did not finish in {self.timeout:g}s (a peer is gone?)"
        print(f"rank {self.rank}: {self.fired}: aborting the communicators", file=sys.stderr, flush=True)
        dist.distributed_c10d._abort_process_group()
        time.sleep(self.timeout)
        os._exit(TIMEOUT_EXIT)


def straggle(ms: float, cause: str) -> None:
    if cause == "sleep":
        time.sleep(ms / 1000)
        return
    end = time.monotonic() + ms / 1000  # busy on the CPU: what the sched receiver tells from waiting
    while time.monotonic() < end:
        pass


def train(a: argparse.Namespace, watchdog: Watchdog) -> None:
    """The training loop; raises what torch raises when a collective fails."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    tp = tp_degree(a.tp, world, per_node)
    mesh = init_device_mesh("cuda", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    write_comms(mesh, rank)
    model = build_model(mesh, torch.device("cuda", torch.cuda.current_device()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(mesh.get_local_rank("dp"))  # same batch across tp, one per dp rank
    for step in range(1, a.steps + 1):
        watchdog.arm(step)
        if rank == a.straggler:
            straggle(a.straggler_delay_ms, a.straggler_cause)
        batch = torch.randn(BATCH, WIDTH, generator=gen).cuda()  # a host copy: real data on the twin
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)  # the logged loss, averaged over the world
        torch.cuda.synchronize()
        say(f"oe-demo step rank={rank} step={step}")
        if rank == a.kill_rank and step == a.kill_after_step:
            time.sleep(EXIT_LINGER_S)
            print(f"rank {rank}: killing myself (SIGKILL) after step {step}, as asked", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    watchdog.arm(a.steps + 1)  # the closing barrier is bounded too
    dist.barrier()


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=a.timeout_s))
    rank = dist.get_rank()
    watchdog = Watchdog(rank, a.timeout_s)
    watchdog.start()
    try:
        train(a, watchdog)
    except Exception as exc:  # a collective failed: the watchdog aborted it, or NCCL reported an error
        print(f"rank {rank}: {watchdog.fired or 'a collective failed'}: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr, flush=True)
        time.sleep(EXIT_LINGER_S)
        sys.stdout.flush()
        # Not through the interpreter's exit: it restores the default SIGTERM action, and torchrun's SIGTERM
        # during torch's (slow) tear-down of aborted communicators would then end us with -15 instead.
        os._exit(TIMEOUT_EXIT)
    watchdog.deadline = float("inf")
    dist.destroy_process_group()
    time.sleep(EXIT_LINGER_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
