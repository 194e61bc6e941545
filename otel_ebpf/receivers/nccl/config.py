"""Configuration of the NCCL receiver (``receivers: {nccl: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    libraries: list[str] = doc(
        [], "Extra libnccl.so paths to probe, on top of those found per process "
            "(/proc/PID/maps, the traced command's Python environment, ldconfig) and those "
            "opened later (caught in the kernel).")
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages. A full buffer drops records, counted "
             "as otel_ebpf.events.dropped{reason=ringbuf_full}; sequence numbers are kept in the "
             "kernel, so a dropped record never shifts the numbering of later calls.", pow2=True)
    pause_on_load: bool = doc(
        True, "Stop (SIGSTOP) a traced process that opens libnccl until the probes are attached, "
              "then continue it (SIGCONT), so its first ncclCommInitRank is seen: without it the "
              "communicator has no id and its collectives cannot be joined across ranks. "
              "Trade-off: the process is stopped for the attach time (tens of ms), never longer "
              "than service.pause_timeout whatever the agent does (docs/reliability.md, 'The pause "
              "guard').")
    gpu_time: bool = doc(
        True, "Have 'otel-ebpf run' load otel-ebpf's NCCL profiler plugin into the command it starts "
              "(NCCL_PROFILER_PLUGIN), for the GPU-side time, algorithm and bandwidth of every collective and "
              "send/recv (docs/nccl-profiler.md). The receiver attaches to the plugin in any traced process "
              "that loaded it, whatever this says.")
    host_calls: bool = doc(
        True, "Probe libnccl's API (ncclAllReduce, ncclCommInitRank, ...): a span per host call, communicator ids "
              "from the unique id, split ranks, groups, desync on the host side. false: spans come from the "
              "profiler plugin alone (one per collective and send/recv, with GPU time, NCCL's commHash and "
              "per-function seq: docs/nccl-profiler.md), fewer uprobe hits per collective. A process whose NCCL "
              "is linked statically (no libnccl to probe) gets the plugin's spans either way.")
    chain_plugin: str = doc(
        "", "A profiler plugin of your own for NCCL to keep running behind ours (NCCL_PROFILER_PLUGIN's "
            "syntax: a path, or NAME for libnccl-profiler-NAME.so): ours loads it and forwards every call. "
            "Empty: whatever NCCL_PROFILER_PLUGIN named in the command's environment.")
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)
    max_inflight: int = doc(
        10240, "Calls in progress tracked at once (entry seen, return not yet), over all threads. "
               "Beyond it calls are not traced, counted as reason=state_map_full.", min=1)
    max_comms: int = doc(
        4096, "Live communicators (per process, per handle) whose sequence numbers the kernel "
              "keeps. Beyond it new communicators' calls carry no sequence number and are not "
              "joined across ranks (reason=state_map_full).", min=1)
    max_p2p_counters: int = doc(
        65536, "(communicator, peer, direction) send/recv counters in the kernel, least recently "
               "used evicted first: an evicted pair restarts at 0 and its later sends and receives "
               "no longer match.", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
