"""`otel-ebpf check` names the real fault: privileges (and what follows from them), NVML with or without a GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.receivers.nvml import presence
from otel_ebpf.service import check
from otel_ebpf.service.check import INFO, MISSING, Row, missing_caps, tracefs_mounts, verdict


def status_file(tmp_path: Path, cap_eff: int) -> str:
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\nCapBnd:\t000001ffffffffff\n")
    return str(path)


def test_missing_caps_reads_the_effective_set(tmp_path: Path) -> None:
    all_three = 1 << 39 | 1 << 38 | 1 << 21
    assert missing_caps(status_file(tmp_path, all_three)) == []
    assert missing_caps(status_file(tmp_path, 1 << 21)) == ["CAP_BPF", "CAP_PERFMON"]
    assert missing_caps(status_file(tmp_path, 0)) == ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"]
    assert missing_caps(str(tmp_path / "absent")) == ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"]


def test_tracefs_mounts_come_from_the_mount_table(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ntracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n"
                      "debugfs /sys/kernel/debug debugfs rw 0 0\n")
    assert tracefs_mounts(str(mounts)) == ["/sys/kernel/tracing"]
    assert tracefs_mounts(str(tmp_path / "absent")) == []


def test_the_verdict_names_the_cause_once_and_what_follows_from_it() -> None:
    rows = [Row("privileges", MISSING, "not root", required=True),
            Row("kernel headers", MISSING, "none", required=True),
            Row("tracefs + uprobes", MISSING, "root only", required=True, cause="privileges"),
            Row("BPF load", MISSING, "needs root", required=True, cause="privileges"),
            Row("NVML (GPU metrics)", INFO, "off")]
    assert verdict(rows) == ("eBPF cannot run here: fix privileges, kernel headers; tracefs + uprobes and BPF load "
                             "fail because of privileges")
    assert verdict(rows[4:]) == "eBPF tracing can run on this host."


@pytest.mark.parametrize("on_pci", [[], ["0000:3b:00.0"]])
def test_nvml_row_without_nvml(monkeypatch: pytest.MonkeyPatch, on_pci: list[str]) -> None:
    monkeypatch.setattr("otel_ebpf.host.nvml.load", lambda library="": (None, "libnvidia-ml.so.1 was not found"))
    monkeypatch.setattr(presence, "nvidia_gpus", lambda root=None: on_pci)
    row = check._nvml()
    if not on_pci:  # a host without a GPU: said once, nothing to fix
        assert (row.status, row.detail, row.fix) == (INFO, "no NVIDIA driver/GPU: NVML metrics off: "
                                                           "libnvidia-ml.so.1 was not found", "")
    else:  # a GPU host whose driver is missing: a fault, with its fix
        assert row.status == MISSING and not row.required
        assert row.detail.startswith("1 NVIDIA GPU(s) on the PCI bus (0000:3b:00.0) but no GPU metrics")
        assert "NVIDIA driver" in row.fix

