"""When a job hangs or slows, on real PyTorch (issue 17's CI tests): FSDP2 jobs on 2 namespace nodes x 2 ranks
(otel_ebpf.twin.cluster: an agent per node with nccl_watch, one gateway), asserted at the gateway's output.

* A hang with a culprit (programs/wl_hang.py): rank 2 stalls 20 s in ``stuck_in_dataloader_fetch`` while ranks
  0, 1 and 3 wait in the step's world all-reduce. Its agent exports its live stack naming that function
  (``otel_ebpf.nccl.rank.stack``); the waiting ranks' stacks show them elsewhere, one collective further; the
  gateway's desync record (``otel_ebpf.nccl.desync``, the report or its update) names rank 2 as missing and the
  function it is in. The time from the stall's start to the stack record is printed (``pytest -s``).
* A persistent straggler (programs/wl_straggle.py: FSDP2 steps of ~330 ms, mostly modelled device time): rank 3
  slowed by 10 % of the step on every step for 6 s, then clean for 5 s: one ``otel_ebpf.nccl.straggler`` record
  raised for it (its host and pid), one cleared (recovered) after it, none raised for another rank, and the
  ``nccl.straggler.persistent`` gauge 1 then 0. Gateway defaults (tested over the steps it finds, ratio 0.8).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.rankstack import RANK_STACK_EVENT
from otel_ebpf.report.otlpfiles import LogRow, read_otlp_json
from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import rank_records

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]

DESYNC = "otel_ebpf.nccl.desync"  # collective_join/hangs.py
STRAGGLER = "otel_ebpf.nccl.straggler"  # collective_join/stragglers.py
CULPRIT = "stuck_in_dataloader_fetch"
STUCK, STALL_S = 2, 20.0  # long enough for nccl_watch's 10 s threshold, its 1 s tick, the capture and export
SLOWED = 3


def _run(program: str, out: Path, args: list[str]) -> tuple[list[LogRow], str]:
    lines: list[str] = []
    run = run_cluster(ClusterSpec(PROGRAMS / program, [str(out), *args], output=out / "gateway", timeout=300),
                      on_line=lambda i, line: lines.append(f"[node-{i}] {line}"))
    output = "\n".join(lines)[-4000:]
    assert run.returncodes == {0: 0, 1: 0} and not run.timed_out and not run.problems, (run.problems, output)
    return read_otlp_json(out / "gateway" / "logs.jsonl").logs, output


def _rank_of(records: list[dict[str, Any]], row: LogRow) -> int | None:
    """The global rank whose process sent ``row`` (its resource's host and pid), None for none (the gateway)."""
    who = {(str(r["host"]), int(r["pid"])): int(r["rank"]) for r in records}
    return who.get((str(row.resource.get("host.name")), int(row.resource.get("process.pid", -1))))


def test_a_rank_stalled_in_a_python_function_is_named_in_its_stack_and_in_the_gateway_desync(
        bpf_ready: None, twin: TwinEnv, tmp_path: Path) -> None:
    logs, output = _run("wl_hang.py", tmp_path, ["--steps", "5", "--stuck-rank", str(STUCK), "--stuck-step", "3",
                                                  "--stall", str(STALL_S)])
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert hang["rank"] == STUCK and hang["end_ns"], hang
    records = rank_records(tmp_path, 4)
    stacks = [r for r in logs if r.event_name == RANK_STACK_EVENT]
    by_rank: dict[int, list[LogRow]] = {}
    for row in stacks:
        rank = _rank_of(records, row)
        assert rank is not None and row.attributes["nccl.rank"] == rank, row  # the world comm: global ranks
        by_rank.setdefault(rank, []).append(row)
    assert sorted(by_rank) == [0, 1, 2, 3], (sorted(by_rank), output)  # every rank fell silent, each was captured

    stuck = min(by_rank[STUCK], key=lambda r: r.time_ns)
    assert stuck.attributes["code.function.name"] == CULPRIT and stuck.attributes["otel_ebpf.stack.outcome"] == "ok"
    assert str(stuck.attributes["code.file.path"]).endswith("wl_hang.py") and CULPRIT in str(stuck.body)
    comm, seq = stuck.attributes["nccl.comm.id"], stuck.attributes["nccl.seq"]
    for rank in (0, 1, 3):
        for row in by_rank[rank]:  # waiting in the next collective, not in the culprit
            assert CULPRIT not in str(row.body) and row.attributes.get("code.function.name") != CULPRIT, row
            assert (row.attributes["nccl.comm.id"], row.attributes["nccl.seq"]) == (comm, seq + 1), row

    desyncs = [r for r in logs if r.event_name == DESYNC and r.attributes["nccl.comm.id"] == comm]
    named = [r for r in desyncs if any(CULPRIT in f for f in r.attributes.get("nccl.missing.functions", ()))]
    assert named, [(r.attributes, r.body) for r in desyncs]
    first = min(named, key=lambda r: r.time_ns)
    a = first.attributes
    assert a["nccl.seq"] == seq + 1 and list(a["nccl.missing_ranks"]) == [STUCK], a
    assert list(a["nccl.waiting_ranks"]) == [0, 1, 3] and list(a["nccl.missing.stack_ranks"]) == [STUCK], a
    assert CULPRIT in str(first.body), first.body

    to_stack = (stuck.time_ns - hang["start_ns"]) / 1e9
    to_desync = (first.time_ns - hang["start_ns"]) / 1e9
    print(f"\nhang of rank {STUCK} in {CULPRIT}: its stack record {to_stack:.2f} s after the stall began, the "
          f"gateway's desync record naming it {to_desync:.2f} s after (update: {a.get('nccl.desync.update', False)})")
    # not before the 10 s silence threshold (its last NCCL call ended just before the stall), and while it lasted
    assert 9.0 < to_stack < STALL_S and to_stack <= to_desync < STALL_S + 5.0, (to_stack, to_desync)


def _gauge(metrics: Path, rank: int) -> list[int]:
    """The nccl.straggler.persistent values of ``rank`` in the order exported."""
    values = []
    for _res, metric in metrics_from_jsonl(metrics):
        if metric.name == "nccl.straggler.persistent":
            values += [int(p.as_int) for p in metric.gauge.data_points
                       if decode_attrs(p.attributes).get("nccl.rank") == rank]
    return values


def test_a_rank_slowed_on_every_step_is_named_once_and_cleared_once_it_recovers(
        bpf_ready: None, twin: TwinEnv, tmp_path: Path) -> None:
    args = ["--trials", str(SLOWED), "--slow-frac", "0.10", "--compute-ms", "300", "--warmup-steps", "8",
            "--lead-s", "3", "--slow-s", "6", "--clean-s", "5"]
    logs, output = _run("wl_straggle.py", tmp_path, args)
    records = rank_records(tmp_path, 4)
    (trial,) = json.loads((tmp_path / f"trials{SLOWED}.json").read_text())["trials"]
    events = sorted((r for r in logs if r.event_name == STRAGGLER), key=lambda r: r.time_ns)
    said = [(r.attributes["nccl.straggler.state"], r.attributes["nccl.rank"], r.body) for r in events]
    assert [(state, rank) for state, rank, _ in said] == [("raised", SLOWED), ("cleared", SLOWED)], (said, output)
    raised, cleared = events
    me = records[SLOWED]
    a = raised.attributes
    assert (a["host.name"], a["process.pid"]) == (me["host"], me["pid"]) == (f"node-{SLOWED // 2}", me["pid"])
    assert a["nccl.straggler.share"] >= 0.8 and a["nccl.straggler.steps"] >= 4 and a["nccl.straggler.p"] < 1e-5, a
    assert 250e6 < a["nccl.straggler.step_ns"] < 450e6, a  # the ~330 ms step found
    assert cleared.attributes["nccl.straggler.cleared.reason"] == "recovered"
    detected = (raised.time_ns - trial["start_ns"]) / 1e9
    recovered = (cleared.time_ns - trial["slow_end_ns"]) / 1e9
    base_ms = json.loads((tmp_path / f"trials{SLOWED}.json").read_text())["base_ns"] / 1e6
    print(f"\nrank {SLOWED} slowed by 10 % of a {base_ms:.0f} ms step: raised {detected:.2f} s after its first slowed "
          f"step ({a['nccl.straggler.decided_by']}: {a['nccl.straggler.steps']} steps of "
          f"{a['nccl.straggler.step_ns'] / 1e6:.0f} ms, p {a['nccl.straggler.p']:.1e}), cleared "
          f"{recovered:.2f} s after it recovered")
    assert 0 < detected < (trial["slow_end_ns"] - trial["start_ns"]) / 1e9 + 2.0, detected
    assert 0 < recovered < (trial["end_ns"] - trial["slow_end_ns"]) / 1e9 + 2.0, recovered
    gauge = _gauge(tmp_path / "gateway" / "metrics.jsonl", SLOWED)
    assert 1 in gauge and gauge[-1] == 0, gauge


GPU_SLOW = 1


def test_a_rank_slow_on_the_gpu_with_its_host_on_time_is_named_as_a_gpu_straggler(
        bpf_ready: None, twin: TwinEnv, tmp_path: Path) -> None:
    """Rank 1's stream runs 10 ms behind on every step (4 launches of 2.5 ms of modelled device time before
    each all-reduce), its host calls on time (every rank's host varies by up to 3 ms a step: the program's doc):
    the gateway raises it once with ``nccl.straggler.kind = gpu``, from the GPU sides of the collectives (the
    NCCL profiler plugin, which ``otel-ebpf run`` loads), and names nobody as late to arrive. With the hosts
    within 3 ms of each other and the stream 10 ms behind, its late kernels are the stream's (cause gpu_queue)."""
    args = ["--slow-rank", str(GPU_SLOW), "--kernel-us", "2500", "--launches", "4", "--host-ms", "20",
            "--noise-ms", "3", "--steps-gpu", "250"]
    logs, output = _run("wl_gpu_slow.py", tmp_path, args)
    records = rank_records(tmp_path, 4)
    events = [r for r in logs if r.event_name == STRAGGLER]
    said = [(r.attributes["nccl.straggler.state"], r.attributes["nccl.straggler.kind"], r.attributes["nccl.rank"],
             r.body) for r in events]
    raised = [e for e in events if e.attributes["nccl.straggler.state"] == "raised"]
    assert [(kind, rank) for state, kind, rank, _ in said if state == "raised"] == [("gpu", GPU_SLOW)], (said, output)
    a = raised[0].attributes
    me = records[GPU_SLOW]
    assert (a["host.name"], a["process.pid"]) == (me["host"], me["pid"]), a
    assert a["nccl.straggler.gpu.share"] >= 0.8 and a["nccl.straggler.p"] < 1e-5 and a["nccl.straggler.steps"] >= 4, a
    # the stream's, all but at most one (a 10 ms scheduler stall of its host on this 2-core VM would be the host's)
    assert a["nccl.straggler.gpu.queued_count"] >= a["nccl.straggler.gpu.last_count"] - 1, a
    assert 5_000_000 <= a["nccl.straggler.gpu.lead_ns"] <= 40_000_000, a  # ~10 ms of queued device time
    (note,) = [json.loads((tmp_path / f"gpu_slow{GPU_SLOW}.json").read_text())]
    print(f"\nrank {GPU_SLOW} 10 ms behind on its stream: raised as a GPU straggler "
          f"{(raised[0].time_ns - note['start_ns']) / 1e9:.2f} s after the first step: {raised[0].body}")
