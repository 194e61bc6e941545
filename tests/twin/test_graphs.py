"""CUDA graphs on the twin, driven by real torch: ``torch.cuda.graph`` captures kernels, a side stream's work and
NCCL all_reduces (through ProcessGroupNCCL, on the current stream and on its own stream) without running them, and
each ``replay`` runs them again, moving the ranks' data (otel_ebpf/twin/cudart_capture.c, cudart_graphs.c,
nccl_group.c). Work the CUDA 13.0 runtime refuses during a capture is refused, and the capture ends invalidated."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_ebpf.twin import TwinEnv, launch
from tests.twin.conftest import PROGRAMS

NRANKS = 2
CAPTURED_KERNELS = 3  # x * 2, + 1 on the capturing stream; x + 1 on the side stream
REPLAYS = 3
# driver_types.h 13.0
SUCCESS, ILLEGAL_STATE, CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED = 0, 401, 900, 901
STATUS_INVALIDATED = 2  # cudaStreamCaptureStatusInvalidated


def _stats(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def _run(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> tuple[list[Any], list[Any], list[dict[str, int]]]:
    stats = tmp_path / "stats"
    stats.mkdir()
    run = launch(PROGRAMS / "graphs.py", NRANKS, [str(tmp_path)], env={"OTEL_EBPF_TWIN_STATS": str(stats)},
                 timeout=240, twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    assert "The CUDA Graph is empty" not in run.output, run.output[-4000:]
    found = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(NRANKS)]
    refused = [json.loads((tmp_path / f"rank{r}.refused.json").read_text()) for r in range(NRANKS)]
    return found, refused, [_stats(stats / f"cudart-{f['pid']}.txt") for f in found]


def test_captured_all_reduce_runs_at_each_replay_not_at_capture(twin: TwinEnv, twin_cache: Path,
                                                                 tmp_path: Path) -> None:
    found, refused, counts = _run(twin, twin_cache, tmp_path)
    for f, c in zip(found, counts, strict=True):
        assert f["warm"] == [3.0] * 4  # the eager all_reduce before the capture
        assert f["capturing_inside"] is True and f["side_capturing"] is True and f["capturing_after"] is False
        assert not any("empty" in w for w in f["warnings"]), f["warnings"]
        # buf (16, synchronous all_reduce) then buf2 (4, async_op=True + wait): ones, summed over 2 ranks per replay
        assert f["after_capture"] == [1.0] * 20  # capturing ran neither all_reduce
        assert f["after_one_replay"] == [2.0] * 20
        assert f["after_three_replays"] == [float(NRANKS ** REPLAYS)] * 20
        assert c["captured_launches"] >= CAPTURED_KERNELS, c
        assert c["kernel_launches"] >= c["captured_launches"], c  # captured launches are launch calls too
        assert c["graph_launches"] == REPLAYS, c
        assert c["graph_kernels"] == REPLAYS * c["captured_launches"], c

    for r in refused:
        # torch.cuda.current_stream().synchronize() inside torch.cuda.graph: the runtime refuses it, and the
        # capture_end of torch.cuda.graph's __exit__ then reports the capture invalidated
        assert "cudaErrorStreamCaptureInvalidated" in r["sync_raised"][0], r["sync_raised"]
        assert any("cudaErrorStreamCaptureUnsupported" in m for m in r["sync_raised"][1:]), r["sync_raised"]
        assert r["capturing_after_sync"] is False
        # a side stream that joined the capture and was not joined back
        assert any("cudaErrorStreamCaptureUnjoined" in m for m in r["unjoined_raised"]), r["unjoined_raised"]
        assert r["side_capturing_after"] is False
        # the runtime API itself: no capture on the legacy stream, none twice; a pageable (host-synchronous)
        # copy on a capturing stream is refused and invalidates the capture, which then ends with no graph
        assert r["codes"] == {"begin_legacy": CAPTURE_UNSUPPORTED, "begin": SUCCESS, "begin_again": ILLEGAL_STATE,
                              "pageable_copy": CAPTURE_UNSUPPORTED, "is_capturing": SUCCESS,
                              "end": CAPTURE_INVALIDATED, "end_again": ILLEGAL_STATE, "copy_after_end": SUCCESS}
        assert r["status_after_copy"] == STATUS_INVALIDATED and r["graph_after_end"] is None
        assert r["copied"] == [float(i) for i in range(8)]  # the stream runs its work again after the capture
