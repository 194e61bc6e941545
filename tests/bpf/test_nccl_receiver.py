"""The NCCL receiver's real uprobes on real rank processes, then the NCCL processor's join.

A 3-rank job of tests/support/nccl_rank against the stand-in libnccl.so.2 (known calls, see
nccl_rank.c), traced by one receiver; tests/bpf/nccl_extra.c for the calls nccl_rank does not
make; NVIDIA's libnccl.so.2 (no GPU: ncclCommInitRank fails, its probes still fire).
Every wait is bounded.
"""
from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.nccl import Config as ProcessorConfig
from otel_ebpf.processors.nccl import NcclProcessor
from otel_ebpf.receivers.nccl import Config, NcclReceiver, factory
from otel_ebpf.receivers.nccl.events import (
    NcclCollective,
    NcclCommEnd,
    NcclCommInfo,
    NcclCommInit,
    NcclCommInitAll,
    NcclCommSplit,
    NcclGroup,
    NcclP2P,
)
from otel_ebpf.core.telemetry import DROPPED

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
N, STEPS = 3, 3
# nccl_rank's collectives per step: (op, count, datatype, redop, root)
STEP = [("AllReduce", None, 7, 0, None), ("Broadcast", 256, 6, None, 0), ("AllGather", 100, 8, None, None),
        ("ReduceScatter", 64, 9, 2, None)]


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def _ready(proc: subprocess.Popen[str], timeout: float = 30.0) -> int:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the program never printed 'ready'"
    line = proc.stdout.readline()
    assert line.startswith("ready pid="), line
    return int(line.split("=", 1)[1])


@dataclass
class Run:
    """What one traced run produced: events per pid, the programs' stdout, exit codes."""

    sink: ListConsumer
    ctx: Context
    pids: list[int]
    stdout: list[str] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)

    def of(self, pid: int, *types: type) -> list[object]:
        return [e for e in self.sink.events if getattr(e, "pid", None) == pid and isinstance(e, types)]


def run_traced(argvs: list[list[str]], config: Config | None = None, *, wait_ready: bool = True,
               timeout: float = 60.0, env: dict[str, str] | None = None) -> Run:
    """Start every program (they wait on stdin; ``env``: their environment), trace them all with one
    receiver, release them, wait until each has exited and its ProcessExit was read."""
    procs = [subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for a in argvs]
    receiver: NcclReceiver | None = None
    try:
        if wait_ready:
            for p in procs:
                _ready(p)
        ctx, sink = Context(target_pids=[p.pid for p in procs]), ListConsumer()
        receiver = factory.create(config or Config(), ctx, sink)
        receiver.start()
        run = Run(sink, ctx, [p.pid for p in procs])
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            run.stdout.append(out)
            run.codes.append(p.returncode)
        _wait_for("every ProcessExit", lambda: all(run.of(pid, ProcessExit) for pid in run.pids))
        return run
    finally:
        if receiver is not None:
            receiver.shutdown()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


# ---- the 3-rank job on the stand-in --------------------------------------------------------

@dataclass
class Job:
    run: Run
    unique_id: bytes


@pytest.fixture(scope="module")
def job(bpf_ready: None, built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Job:
    id_file = tmp_path_factory.mktemp("nccl_job") / "id"
    argvs = [[str(built["nccl_rank"]), str(built["stand_in_nccl"]), "--rank", str(r), "--nranks", str(N),
              "--id-file", str(id_file), "--steps", str(STEPS), "--split", "--wait-stdin",
              *(["--create-id"] if r == 0 else [])] for r in range(N)]
    run = run_traced(argvs)
    assert run.codes == [0] * N, run.stdout
    return Job(run, id_file.read_bytes())


def test_comm_init_reads_the_unique_id_from_the_stack_and_rank_from_edx(job: Job) -> None:
    assert len(job.unique_id) == 128
    for rank, pid in enumerate(job.run.pids):
        (init,) = job.run.of(pid, NcclCommInit)
        assert init.function == "ncclCommInitRank" and init.rc == 0 and init.comm != 0
        assert init.unique_id == job.unique_id
        assert (init.rank, init.nranks) == (rank, N)
        assert init.start_ns <= init.end_ns


def test_collectives_are_decoded_and_numbered_per_communicator(job: Job) -> None:
    for pid in job.run.pids:
        (init,) = job.run.of(pid, NcclCommInit)
        calls = [c for c in job.run.of(pid, NcclCollective) if c.comm == init.comm]
        assert len(calls) == STEPS * len(STEP)
        for i, call in enumerate(calls):
            step, (op, count, datatype, redop, root) = divmod(i, len(STEP))[0], STEP[i % len(STEP)]
            assert (call.op, call.datatype, call.redop, call.root) == (op, datatype, redop, root)
            assert call.count == (count if count is not None else 1024 * (step + 1))
            assert call.seq == i and call.rc == 0 and call.group == 0


def test_send_recv_are_numbered_per_peer_and_direction_inside_groups(job: Job) -> None:
    for rank, pid in enumerate(job.run.pids):
        sends = [e for e in job.run.of(pid, NcclP2P) if e.op == "Send"]
        recvs = [e for e in job.run.of(pid, NcclP2P) if e.op == "Recv"]
        assert [(s.peer, s.seq, s.count, s.datatype) for s in sends] == \
            [((rank + 1) % N, k, 10, 2) for k in range(STEPS)]
        assert [(r.peer, r.seq) for r in recvs] == [((rank - 1) % N, k) for k in range(STEPS)]
        groups = job.run.of(pid, NcclGroup)
        assert [g.members for g in groups] == [2] * STEPS and all(g.rc == 0 for g in groups)
        for g, s, r in zip(groups, sends, recvs, strict=True):
            assert s.group == r.group == g.group != 0
            assert g.start_ns <= s.start_ns <= r.end_ns <= g.end_ns


def test_split_and_destroy_are_seen(job: Job) -> None:
    for rank, pid in enumerate(job.run.pids):
        (init,) = job.run.of(pid, NcclCommInit)
        (split,) = job.run.of(pid, NcclCommSplit)
        assert (split.parent, split.color, split.key, split.rc) == (init.comm, rank % 2, rank, 0)
        assert split.comm not in (0, init.comm)
        (sub_call,) = [c for c in job.run.of(pid, NcclCollective) if c.comm == split.comm]
        assert (sub_call.op, sub_call.count, sub_call.seq) == ("AllReduce", 4096, 0)
        ends = job.run.of(pid, NcclCommEnd)
        assert [(e.comm, e.abort, e.rc) for e in ends] == [(split.comm, False, 0), (init.comm, False, 0)]


def _processed(job: Job) -> list[SpanRecord]:
    sink = ListConsumer()
    proc = NcclProcessor(ProcessorConfig(), Context(), sink)
    proc.consume(list(job.run.sink.events))
    proc.shutdown()
    return [r for r in sink.events if isinstance(r, SpanRecord)]


def test_processor_joins_every_collective_across_ranks_with_one_root_from_rank0(job: Job) -> None:
    spans = _processed(job)
    parent_comm = {s.attributes["nccl.comm.id"] for s in spans if s.name == "ncclCommInitRank"}
    assert len(parent_comm) == 1
    comm_id = parent_comm.pop()
    members = [s for s in spans if s.attributes.get("nccl.comm.id") == comm_id and "nccl.seq" in s.attributes
               and s.name not in ("ncclSend", "ncclRecv") and s.parent_span_id is not None]
    assert len(members) == N * STEPS * len(STEP)
    for seq in range(STEPS * len(STEP)):
        same = [s for s in members if s.attributes["nccl.seq"] == seq]
        assert sorted(s.attributes["nccl.rank"] for s in same) == list(range(N))
        assert len({(s.trace_id, s.parent_span_id) for s in same}) == 1
        assert len({s.attributes["nccl.op"] for s in same}) == 1
        (root,) = [s for s in spans if s.name.startswith("nccl ") and s.trace_id == same[0].trace_id]
        assert root.pid == job.run.pids[0] and root.span_id == same[0].parent_span_id
        assert root.parent_span_id is None


def test_processor_matches_send_k_with_recv_k_and_links_group_members(job: Job) -> None:
    spans = _processed(job)
    sends = [s for s in spans if s.name == "ncclSend"]
    recvs = {(s.attributes["nccl.peer"], s.attributes["nccl.rank"], s.attributes["nccl.seq"]): s
             for s in spans if s.name == "ncclRecv"}
    groups = {s.span_id: s for s in spans if s.name == "ncclGroup"}
    assert len(sends) == len(recvs) == N * STEPS and len(groups) == N * STEPS
    for send in sends:
        recv = recvs[(send.attributes["nccl.rank"], send.attributes["nccl.peer"], send.attributes["nccl.seq"])]
        assert send.trace_id == recv.trace_id
        assert send.links[0].span_id == recv.span_id and recv.links[0].span_id == send.span_id
        (group_link,) = [lk for lk in send.links if lk.span_id in groups]
        assert groups[group_link.span_id].pid == send.pid


def test_processor_gives_split_members_of_one_color_one_communicator(job: Job) -> None:
    spans = _processed(job)
    child = {s.pid: s.attributes["nccl.comm.id"] for s in spans if s.name == "ncclCommSplit"}
    p = job.run.pids
    assert child[p[0]] == child[p[2]] != child[p[1]]
    sub = {s.pid: s for s in spans if s.name == "ncclAllReduce" and s.attributes["nccl.count"] == 4096}
    assert sub[p[0]].trace_id == sub[p[2]].trace_id != sub[p[1]].trace_id


# ---- calls nccl_rank does not make --------------------------------------------------------

@pytest.fixture(scope="module")
def nccl_extra(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nccl_extra") / "nccl_extra"
    subprocess.run(["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror", "-o",
                    str(out), str(HERE / "nccl_extra.c"), "-ldl"], check=True, capture_output=True, timeout=60)
    return out


def test_library_opened_after_start_is_attached_and_every_call_kind_decoded(
        bpf_ready: None, built: dict[str, Path], nccl_extra: Path) -> None:
    run = run_traced([[str(nccl_extra), str(built["stand_in_nccl"]), "calls", "--wait-before-load"]])
    assert run.codes == [0], run.stdout
    pid = run.pids[0]
    printed_id = bytes.fromhex(run.stdout[0].split("id=", 1)[1].split()[0])
    inits = run.of(pid, NcclCommInit)
    assert [(i.function, i.rank, i.nranks, i.unique_id) for i in inits] == \
        [("ncclCommInitRankConfig", 1, 2, printed_id), ("ncclCommInitRank", 1, 2, printed_id)]
    main = inits[0].comm
    colls = [c for c in run.of(pid, NcclCollective) if c.comm == main]
    assert [(c.op, c.count, c.datatype, c.redop, c.root, c.stream, c.seq, c.rc) for c in colls] == [
        ("Reduce", 32, 1, 3, 1, 0x1234, 0, 0), ("AllReduce", 16, 4, 1, None, 0x5678, 1, 0),
        ("AlltoAll", 8, 8, None, None, 0, 2, 0), ("AllReduce", 16, 99, 0, None, 0, None, 4)]
    (group,) = run.of(pid, NcclGroup)
    p2p = run.of(pid, NcclP2P)
    assert group.members == 2 and [(e.op, e.group) for e in p2p] == [("Send", group.group), ("Recv", group.group)]
    (split,) = run.of(pid, NcclCommSplit)
    info = [(i.comm, i.what, i.value) for i in run.of(pid, NcclCommInfo)]
    assert info == [(main, "nranks", 2), (main, "rank", 1), (main, "device", 1)]
    (init_all,) = run.of(pid, NcclCommInitAll)
    assert init_all.ndev == 3 and init_all.devices == (4, 5, 6) and 0 not in init_all.comms
    bcasts = [c.comm for c in run.of(pid, NcclCollective) if c.op == "Broadcast"]
    assert bcasts == list(init_all.comms)
    ends = [(e.comm, e.abort) for e in run.of(pid, NcclCommEnd)]
    assert ends[0] == (split.comm, True) and ends[-1] == (main, False) and len(ends) == 6


# ---- NVIDIA's libnccl.so.2 -----------------------------------------------------------------

def test_real_libnccl_init_entry_captures_the_unique_id(bpf_ready: None, built: dict[str, Path],
                                                         tmp_path: Path) -> None:
    from tests.support.build import real_nccl

    lib = real_nccl()
    if lib is None:
        pytest.fail("nvidia-nccl-cu12 is a test dependency and must be installed")
    id_file = tmp_path / "id"
    run = run_traced([[str(built["nccl_rank"]), str(lib), "--rank", "0", "--nranks", "2", "--id-file",
                       str(id_file), "--create-id", "--wait-stdin"]])
    assert run.codes == [2], run.stdout  # ncclCommInitRank fails without a GPU
    (init,) = run.of(run.pids[0], NcclCommInit)
    assert init.unique_id == id_file.read_bytes()
    assert (init.rank, init.nranks, init.comm) == (0, 2, 0) and init.rc not in (0, 7)


# ---- no silent loss under load --------------------------------------------------------------

def test_every_call_of_a_tight_loop_is_recorded_or_counted_dropped(
        bpf_ready: None, built: dict[str, Path], nccl_extra: Path) -> None:
    calls = 20_000
    run = run_traced([[str(nccl_extra), str(built["stand_in_nccl"]), "bench", str(calls), "--wait-stdin"]],
                     Config(ringbuf_pages=16))
    assert run.codes == [0]
    total = calls + 1000  # the loop plus its warm-up
    seqs = [c.seq for c in run.of(run.pids[0], NcclCollective)]
    dropped = run.ctx.telemetry.get(DROPPED, receiver="nccl", reason="ringbuf_full")
    # the bench ends with ncclCommDestroy, right after the loop: its record may meet a full buffer too
    ends = len(run.of(run.pids[0], NcclCommEnd))
    assert len(seqs) + ends + dropped == total + 1, (len(seqs), ends, dropped)
    # numbered in the kernel: a dropped record leaves a gap, it never shifts later numbers
    assert seqs == sorted(set(seqs)) and all(0 <= s < total for s in seqs)
    assert dropped > 0, "16 pages must overflow in this loop, else the test proves nothing"
    assert max(seqs) >= len(seqs), "the records after a drop were renumbered"


# ---- kernel state is freed ------------------------------------------------------------------

def test_state_of_a_thread_killed_inside_a_call_and_of_an_exited_process_is_freed(
        bpf_ready: None, built: dict[str, Path], tmp_path: Path) -> None:
    argv = [str(built["nccl_rank"]), str(built["stand_in_nccl"]), "--rank", "0", "--nranks", "1",
            "--id-file", str(tmp_path / "id"), "--create-id", "--wait-stdin", "--delay-us", "30000000"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    receiver = None
    try:
        _ready(proc)
        receiver = factory.create(Config(), Context(target_pids=[proc.pid]), ListConsumer())
        receiver.start()
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        calls, comms = receiver.bpf["calls"], receiver.bpf["comms"]
        _wait_for("the rank to sit inside ncclAllReduce", lambda: len(list(calls.keys())) == 1)
        assert [k.tgid for k in comms.keys()] == [proc.pid]
        proc.kill()
        proc.wait(timeout=10)
        _wait_for("the killed thread's call state to go", lambda: not list(calls.keys()))
        assert receiver.sweep() == 1 and not list(comms.keys())  # never destroyed: swept
    finally:
        if receiver is not None:
            receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ---- ncclCommAbort from another thread while a call is blocked ----------------------------------

def test_a_call_blocked_while_another_thread_aborts_its_communicator_keeps_its_number_and_comm(
        bpf_ready: None, tmp_path: Path) -> None:
    """tests/bpf/nccl_abort.c: the abort returns (its state forgotten) before the blocked call does."""
    src, lib, prog = HERE / "nccl_abort.c", tmp_path / "libnccl.so.2", tmp_path / "nccl_abort"
    cc = ["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror"]
    subprocess.run([*cc, "-DFAKE_LIB", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    subprocess.run([*cc, "-o", str(prog), str(src), "-ldl", "-lpthread"], check=True, timeout=60)
    run = run_traced([[str(prog), str(lib), "--wait-stdin"]])
    assert run.codes == [0] and "same handle=1" in run.stdout[0], run.stdout
    pid = run.pids[0]
    inits, (abort, destroy) = run.of(pid, NcclCommInit), run.of(pid, NcclCommEnd)
    colls = run.of(pid, NcclCollective)
    assert [(c.count, c.comm, c.seq) for c in colls] == [(0, abort.comm, 0), (1, abort.comm, 1), (0, abort.comm, 0)]
    blocked = colls[1]
    assert abort.abort and blocked.tid != abort.tid and abort.end_ns < blocked.end_ns
    assert run.sink.events.index(abort) < run.sink.events.index(blocked)  # the real order: abort first
    out = ListConsumer()
    proc = NcclProcessor(ProcessorConfig(host="h"), Context(), out)
    proc.start()
    proc.consume(list(run.sink.events))
    spans = [s for s in out.events if isinstance(s, SpanRecord) and s.name == "ncclAllReduce"]
    assert len(inits) == 2 and [s.attributes.get("nccl.seq") for s in spans] == [0, 1, 0]
    ids = [s.attributes.get("nccl.comm.id") for s in spans]
    assert ids[0] == ids[1] != ids[2] and None not in ids and all(s.trace_id is not None for s in spans)
    assert destroy.comm == abort.comm and not destroy.abort
