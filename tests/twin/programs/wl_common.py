"""What every workload program (``wl_*.py``) shares: set-up, phases, the injected straggler and kill, and the
record each rank writes for the tests (tests/twin/test_workloads.py) to compare with the gateway's output.

Imported by the programs as a sibling module (torchrun puts the script's folder first on ``sys.path``).

Options every program takes: ``OUT [--steps N] [--phases a,b] [--straggler RANK --delay S]
[--kill-rank RANK --kill-phase P --kill-step K]``.

* Each step of each phase starts with :meth:`Job.step`: the straggler sleeps ``delay`` seconds, then every rank
  all-reduces a :data:`MARKER`-element tensor on the world group (a training loop's loss all-reduce). That
  collective is the one the straggler is late to by construction, and the tests find it by its count.
* The kill: the rank SIGKILLs itself at the start of step K of phase P, before the marker, so the marker of
  that step is the collective it never joins.
* ``<OUT>/rank<N>.json``: rank, pid, host name, each group torch used (name, global members, torch's
  ``get_rank``/``get_world_size`` of it) and each phase's host-time window (epoch ns; end null while it
  runs), so the tests can tell which workload a span came from.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MARKER = 7  # elements of the step marker all-reduce: no other collective of the workloads has this count


class Job:
    """One rank's run of a workload program; see the module doc."""

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        parser = argparse.ArgumentParser()
        parser.add_argument("out", type=Path)
        parser.add_argument("--steps", type=int, default=2)
        parser.add_argument("--phases", default="")
        parser.add_argument("--straggler", type=int, default=-1)
        parser.add_argument("--delay", type=float, default=0.0)
        parser.add_argument("--kill-rank", type=int, default=-1)
        parser.add_argument("--kill-phase", default="")
        parser.add_argument("--kill-step", type=int, default=-1)
        parser.add_argument("--pg-timeout", type=float, default=600.0)
        self.args = parser.parse_args(argv)
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(self.device)
        dist.init_process_group("nccl", device_id=self.device, timeout=timedelta(seconds=self.args.pg_timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.groups: list[dict[str, object]] = []
        self.phases: dict[str, tuple[int, int | None]] = {}
        self._phase = ""
        self.record("world", None)

    def record(self, name: str, group: dist.ProcessGroup | None) -> None:
        """Notes torch's view of ``group`` (None: the world) for this rank; non-members record nothing."""
        members = dist.get_process_group_ranks(group or dist.group.WORLD)
        if self.rank in members:
            self.groups.append({"name": name, "members": members, "rank": dist.get_rank(group),
                                "size": dist.get_world_size(group)})

    def tensor(self, values: Sequence[float]) -> torch.Tensor:
        """A device tensor holding ``values`` (copied in from the host: real on the twin)."""
        return torch.tensor(list(values), dtype=torch.float32).to(self.device)

    def step(self, index: int) -> None:
        """Start of a step: the kill, the straggler's sleep, then the world marker all-reduce."""
        a = self.args
        if self.rank == a.kill_rank and self._phase == a.kill_phase and index == a.kill_step:
            self.write()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == a.straggler:
            time.sleep(a.delay)
        dist.all_reduce(self.tensor([float(self.rank)] * MARKER))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the phase (host epoch ns, after a world barrier so no rank's window overlaps another phase's
        collectives) and synchronizes the device at its end. The record is written at the start too (the
        window open: end null), so a job that dies in the phase leaves each rank's record."""
        dist.barrier()
        torch.cuda.synchronize()
        self._phase = name
        start = time.time_ns()
        self.phases[name] = (start, None)
        self.write()
        yield
        torch.cuda.synchronize()
        self.phases[name] = (start, time.time_ns())
        self._phase = ""

    def run(self, phases: dict[str, Callable[[Job], None]]) -> None:
        """Runs the selected phases (all when ``--phases`` is empty) in the given order, writes the record and
        ends the process group."""
        chosen = [p for p in self.args.phases.split(",") if p] or list(phases)
        for name in chosen:
            with self.phase(name):
                phases[name](self)
        self.write()
        dist.barrier()
        dist.destroy_process_group()

    def write(self) -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "groups": self.groups,
                  "phases": self.phases}
        (self.args.out / f"rank{self.rank}.json").write_text(json.dumps(record))
