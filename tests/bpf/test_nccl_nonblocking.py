"""Non-blocking split children bound exactly in the kernel: real uprobes on a rank that makes its children the way
PyTorch 2.11 does (tests/bpf/nccl_nb_split.c: ``ncclCommSplit(..., &comm->ncclComm_, blocking=0)``, each child's
handle stored later by the stand-in's thread, as NCCL 2.28.9's ncclCommInitRankFunc does) on the twin's stand-in
libnccl.so.2, then the NCCL processor. The children are made dp, tp, unused and used tp first; unused is only
destroyed. Every wait is bounded."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.nccl import Config as ProcessorConfig
from otel_ebpf.processors.nccl import NcclProcessor
from otel_ebpf.receivers.nccl.events import NcclCollective, NcclCommBind, NcclCommEnd, NcclCommSplit
from otel_ebpf.twin import TwinSetupError, build, find_env
from tests.bpf.test_nccl_receiver import run_traced

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def nb_split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the compiled driver, the twin's library directory); skipped without the twin (failed under CI)."""
    try:
        env = find_env()
    except TwinSetupError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the twin's stand-in libnccl is needed here: {exc}")
        pytest.skip(f"no twin environment: {exc}")
    libdir = build(env)
    out = tmp_path_factory.mktemp("nccl_nb_split") / "nccl_nb_split"
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{env.nccl_include}", f"-I{env.cuda_include}",
                    "-o", str(out), str(HERE / "nccl_nb_split.c"), f"-L{libdir}", f"-Wl,-rpath-link,{libdir}",
                    "-l:libnccl.so.2"],
                   check=True, capture_output=True, timeout=60)
    return out, libdir


def test_each_child_takes_its_own_handle_whatever_order_the_children_are_used_in(
        bpf_ready: None, nb_split: tuple[Path, Path], tmp_path: Path) -> None:
    driver, libdir = nb_split
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), OTEL_EBPF_TWIN_DIR=str(tmp_path))
    run = run_traced([[str(driver)]], env=env)
    assert run.codes == [0], run.stdout
    pid = run.pids[0]
    printed = {w[1]: (int(w[2].split("=")[1], 16), int(w[3].split("=")[1], 16))
               for w in (line.split() for line in run.stdout[0].splitlines()) if w[0] == "child"}
    dp, tp, unused = printed["dp"], printed["tp"], printed["unused"]  # (newcomm address, handle)
    splits = run.of(pid, NcclCommSplit)
    assert [(s.comm, s.newcomm, s.rc) for s in splits] == [(0, dp[0], 0), (0, tp[0], 0), (0, unused[0], 0)]
    binds = run.of(pid, NcclCommBind)
    assert [(b.newcomm, b.comm) for b in binds] == [tp, dp, unused]  # unused: bound at its destroy
    order = [e for e in run.sink.events if isinstance(e, (NcclCommBind, NcclCollective, NcclCommEnd))]
    assert [(type(e).__name__, e.comm) for e in order][:5] == [
        ("NcclCommBind", tp[1]), ("NcclCollective", tp[1]), ("NcclCollective", tp[1]),
        ("NcclCommBind", dp[1]), ("NcclCollective", dp[1])]  # each bind before the call that made it
    assert [(c.comm, c.seq) for c in run.of(pid, NcclCollective)] == [(tp[1], 0), (tp[1], 1), (dp[1], 0)]

    sink = ListConsumer()
    proc = NcclProcessor(ProcessorConfig(), Context(), sink)
    proc.consume(list(run.sink.events))
    proc.shutdown()
    spans = [r for r in sink.events if isinstance(r, SpanRecord)]
    child_id = {s.attributes["nccl.split.seq"]: s.attributes["nccl.comm.id"]
                for s in spans if s.name == "ncclCommSplit"}
    calls = [(s.attributes["nccl.comm.id"], s.attributes["nccl.seq"], s.attributes["nccl.rank"])
             for s in spans if s.name == "ncclAllReduce"]
    assert calls == [(child_id[1], 0, 0), (child_id[1], 1, 0), (child_id[0], 0, 0)]
    ends = [s.attributes.get("nccl.comm.id") for s in spans if s.name == "ncclCommDestroy"]
    assert ends[:3] == [child_id[0], child_id[1], child_id[2]]
