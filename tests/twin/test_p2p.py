"""Point-to-point on the twin, driven by real torch: ncclSend/ncclRecv move the ranks' data, matched in call
order per peer, and a group's sends and recvs run together at the outermost ncclGroupEnd (NCCL 2.28.9
src/group.cc, src/enqueue.cc p2pTaskAppend), so torch's grouped patterns complete."""
from __future__ import annotations

import json
from pathlib import Path

from otel_ebpf.twin import TwinEnv, launch
from tests.twin.conftest import PROGRAMS


def _run(twin: TwinEnv, twin_cache: Path, out: Path, program: str, nproc: int,
         env: dict[str, str] | None = None) -> dict[int, dict[str, object]]:
    run = launch(PROGRAMS / program, nproc, [str(out)], env=env, timeout=300, twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


def test_uneven_all_to_all_single_moves_each_pairs_slice(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    found = _run(twin, twin_cache, tmp_path, "alltoall_uneven.py", 4)
    for r in range(4):
        # from each source s, (s + r) % 3 elements valued 100 s + 10 r + i, in source order
        assert found[r]["uneven"] == [float(100 * s + 10 * r + i) for s in range(4) for i in range((s + r) % 3)]
        assert found[r]["even"] == [float(100 * s + r) for s in range(4)]


def test_batch_isend_irecv_ring_and_blocking_send_recv(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    found = _run(twin, twin_cache, tmp_path, "batch_p2p.py", 3)
    for r in range(3):
        prev = (r - 1) % 3
        assert found[r]["small"] == [float(prev), prev + 0.5]
        # 3 MiB through a 1 MiB ring: first and last elements of the previous rank's tensor
        assert found[r]["big_first"] == [1000.0 * prev, 1000.0 * prev + 1, 1000.0 * prev + 2]
        assert found[r]["big_last"] == [1000.0 * prev + 786431]
    assert found[2]["blocking"] == [42.0, 43.0] and "blocking" not in found[1]


def test_two_stage_pipeline_passes_each_microbatch(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    found = _run(twin, twin_cache, tmp_path, "pipeline.py", 2)
    assert found[0]["seen"] == []
    assert found[1]["seen"] == [[float(4 * m + i) for i in range(4)] for m in range(4)]


def test_shrink_group_on_non_blocking_communicators(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    """torch's shrink_group with TORCH_NCCL_USE_COMM_NONBLOCKING=1: ncclCommShrink of a non-blocking parent
    returns with the child NULL and finishes on a thread (nccl_comm.c), which torch waits for."""
    found = _run(twin, twin_cache, tmp_path, "p2p_ops.py", 4, env={"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"})
    assert [found[r].get("shrunk") for r in range(4)] == [[0, 3], [1, 3], None, [2, 3]]  # rank 2 excluded
