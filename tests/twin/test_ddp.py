"""Real torch DDP on 2 simulated GPUs: data really moves through the stand-in NCCL."""
from __future__ import annotations

import json
from pathlib import Path

from otel_ebpf.twin import TwinEnv, launch
from tests.twin.conftest import PROGRAMS


def test_ddp_all_reduce_and_gradients_agree(twin: TwinEnv, twin_cache: Path, tmp_path: Path) -> None:
    run = launch(PROGRAMS / "ddp.py", 2, [str(tmp_path)], timeout=240, twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for found in ranks:
        assert found["all_reduce"] == [1.0 + 2.0, 10.0 + 20.0]  # the sum of the ranks' values
        assert len(found["grads"]) == 2  # two steps
        for step in found["grads"]:
            assert all(v == 3.0 for param in step for v in param), step  # rank 0 gave 1, rank 1 gave 2
    assert ranks[0]["grads"] == ranks[1]["grads"]
    assert not list(Path("/dev/shm").glob("otel-ebpf-twin-*")), "the launcher removes its staging files"
