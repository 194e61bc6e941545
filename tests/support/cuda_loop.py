"""A traced workload for the fault suite: calls the real libcudart's ``cudaMemcpy`` in a loop
(each call one span) until a stop file appears or a hard deadline passes, then writes how many
calls it made, so a test can reconcile calls with spans exported + drops counted.

    python cuda_loop.py LIBCUDART [--nccl LIBNCCL] --pidfile F --stop F [--sleep-ms 5] [--max-s 180]

``--nccl`` also loads (dlopen) a libnccl, so an agent attaches its NCCL probes too. The count is
written to ``<stop>.count`` (``calls=N``); the pid to ``--pidfile`` once the libraries are loaded.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("cudart")
    p.add_argument("--nccl")
    p.add_argument("--pidfile", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--sleep-ms", type=float, default=5.0)
    p.add_argument("--max-s", type=float, default=180.0)
    a = p.parse_args()
    rt = ctypes.CDLL(a.cudart)
    if a.nccl:
        ctypes.CDLL(a.nccl)
    with open(a.pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(a.pidfile + ".tmp", a.pidfile)
    calls, deadline = 0, time.monotonic() + a.max_s
    while not os.path.exists(a.stop) and time.monotonic() < deadline:
        rt.cudaMemcpy(None, None, 4096, 1)
        calls += 1
        if a.sleep_ms:
            time.sleep(a.sleep_ms / 1000)
    with open(a.stop + ".count", "w") as f:
        f.write(f"calls={calls}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
