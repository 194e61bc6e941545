"""``otel-ebpf check``'s table: one row per capability, a fix under every row that is not ok."""
from __future__ import annotations

from otel_ebpf.service.check import INFO, MISSING, OK, Row, render


def test_table_has_a_fix_for_each_missing_capability_and_names_the_blockers() -> None:
    rows = [Row("privileges", OK, "running as root", required=True),
            Row("kernel headers", MISSING, "none for 6.18.0", "apt install linux-headers-$(uname -r)", required=True),
            Row("perf counters", MISSING, "check failed: boom"),
            Row("NVML (GPU metrics)", INFO, "unavailable", "needs an NVIDIA driver")]
    lines = render(rows, width=100).splitlines()
    assert lines[0].split(" | ") == ["capability    ".ljust(18), "status ", "detail / fix"]
    assert lines[1].startswith("-" * 18 + "-+-")
    body = lines[2:-2]
    bar = {ln.index(" | ") for ln in body}
    assert len(bar) == 1  # the columns line up on every row
    text = [ln.split(" | ", 2)[2] for ln in body]
    assert text == ["running as root", "none for 6.18.0", "fix: apt install linux-headers-$(uname -r)",
                    "check failed: boom", "fix: see docs/troubleshooting.md", "unavailable",
                    "fix: needs an NVIDIA driver"]
    assert lines[-1] == "eBPF cannot run here: fix kernel headers"


def test_long_details_wrap_inside_their_column_and_ok_rows_show_no_fix() -> None:
    path = "/work/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    lines = render([Row("CUDA runtime", OK, f"{path}, {path}", "set receivers.cuda.libraries")],
                   width=80).splitlines()
    body = lines[2:-2]
    assert len(body) > 1 and all(len(ln) <= 80 or path in ln for ln in body)
    assert body[0].startswith("CUDA runtime | ok ") and all(ln.startswith(" " * 12 + " | ") for ln in body[1:])
    assert not any("fix:" in ln for ln in lines)
    assert " ".join(ln.split(" | ", 2)[2] for ln in body).replace(" ", "") == f"{path},{path}".replace(" ", "")
    assert lines[-1] == "eBPF tracing can run on this host."
