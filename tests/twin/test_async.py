"""NCCL work on the twin is asynchronous as on a GPU: the call returns once the work is on its stream, and
torch's events, stream waits and copies observe its completion (otel_ebpf/twin/cudart_streams.c, nccl_group.c); a
dead peer on another node becomes the communicator's async error, as NCCL's network transport makes it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv, launch
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster
from tests.twin.conftest import PROGRAMS

LATE_S = 2.0


def test_collective_completes_on_the_stream_after_the_call(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    run = launch(PROGRAMS / "async_work.py", 2, [str(tmp_path), str(LATE_S)], timeout=240, twin=twin,
                 cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    early, late = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    # Rank 0's call returns at once although rank 1 is LATE_S late; the work is still pending on the stream.
    assert early["call_s"] < LATE_S / 2, early
    assert early["completed_after_call"] is False
    assert early["event_done_after_wait"] is False  # work.wait() made the stream wait, not the host
    assert early["copy_s"] > LATE_S / 2  # the stream-ordered copy waited for the peer
    assert early["event_done_after_copy"] is True
    # Event timing is stream time: rank 0's includes the wait for the late rank, rank 1's does not.
    assert early["event_ms"] > LATE_S * 1000 / 2 > late["event_ms"], (early, late)
    for found in (early, late):
        assert found["value"] == 1.0 + 2.0  # the all-reduce's real sum
        assert found["mirror"] == 2 * (1.0 + 2.0)  # a copy placed after the second all-reduce saw its result


@pytest.mark.bpf  # namespace nodes need root; nothing is traced
@pytest.mark.timeout(300)
def test_dead_peer_on_another_node_is_an_async_error_torch_acts_on(twin: TwinEnv, libdir: Path,
                                                                  tmp_path: Path) -> None:
    lines: list[tuple[int, str]] = []
    run = run_cluster(ClusterSpec(PROGRAMS / "dead_peer.py", gpus_per_node=1, traced=False, output=tmp_path / "out",
                                  timeout=200, bad_exit_grace=15.0),
                      echo=lambda _s: None, on_line=lambda i, line: lines.append((i, line)))
    node0 = [line for i, line in lines if i == 0]
    log = "\n".join(node0)[-6000:]
    assert run.returncodes[1] != 0 and run.returncodes[0] != 0, log
    assert any("dead-peer start" in line for line in node0), log
    assert not any("dead-peer done" in line for line in node0), log  # the all-reduce never completed
    # torch's watchdog read ncclRemoteError from ncclCommGetAsyncError (its own words), well before the
    # collective's 120 s timeout would have fired
    assert any("raised the following async exception: NCCL error: remote process exited" in line
               for line in node0), log
    assert run.seconds < 100, run.seconds
