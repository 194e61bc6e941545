"""otel_ebpf.core.gctune: the collector settings of the CLI's services, and nobody else's."""
from __future__ import annotations

import gc
import subprocess
import sys

from otel_ebpf.core import gctune


def test_tune_sets_the_thresholds_and_freeze_moves_the_live_heap_out_of_reach():
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        gctune.tune()
        assert gc.get_threshold() == gctune.THRESHOLDS == (10_000, 50, 100)
        keep = [object() for _ in range(10)], {"a": [1]}
        gctune.freeze_startup()
        assert gc.get_freeze_count() > frozen
        assert keep  # alive across the freeze
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_python_api_leaves_the_users_collector_alone():
    """Importing the agent and the Python API (Session runs in the user's process) changes no setting."""
    code = ("import gc; t = gc.get_threshold(); import otel_ebpf, otel_ebpf.api, otel_ebpf.service.agent; "
            "assert gc.get_threshold() == t and gc.get_freeze_count() == 0, (gc.get_threshold(), t)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
