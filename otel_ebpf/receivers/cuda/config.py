"""Configuration of the CUDA runtime receiver (``receivers: {cuda: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    libraries: list[str] = doc(
        [], "Extra libcudart.so paths to probe, on top of those found per process "
            "(/proc/PID/maps, the traced command's Python environment, ldconfig) and those "
            "opened later (caught in the kernel).")
    launch_sample_every: int = doc(
        0, "0: kernel launches are only counted (in the kernel, per grid/block size). N > 0: "
           "also emit every Nth launch of each process as a span with its function address, "
           "grid, block, shared memory and stream.", min=0)
    stats_interval: float = doc(
        1.0, "How often the in-kernel launch counters are read and turned into metrics "
             "(plus once at shutdown).", duration=True, min=0.01)
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages. A full buffer drops records, counted "
             "as otel_ebpf.events.dropped{reason=ringbuf_full}.", pow2=True)
    pause_on_load: bool = doc(
        True, "Stop (SIGSTOP) a traced process that opens libcudart until the probes are "
              "attached, then continue it (SIGCONT), so even its first CUDA calls are traced. "
              "Trade-off: the process is stopped for the attach time (milliseconds to tens of "
              "ms), never longer than service.pause_timeout whatever the agent does (stopped, "
              "hung, starved, killed: docs/reliability.md, 'The pause guard'); a shell or debugger "
              "watching it sees a stop. Set false to never stop processes and accept missing the "
              "calls made while probes attach.")
    span_rate_limit: int = doc(
        10000, "Most spans per second per process for cudaMemcpy* and cuda*Synchronize calls (a "
               "token bucket in the kernel, burst one second's worth). Every call is still counted "
               "in the kernel: their metrics (gpu.cuda.memory.copies, gpu.cuda.memory.copy.duration, "
               "gpu.cuda.synchronize.duration, gpu.cuda.*.synchronize.calls, gpu.cuda.api.errors) stay "
               "exact, and calls left without a span are counted in "
               "otel_ebpf.spans.rate_limited{receiver=cuda}. Each span costs the agent ~6-8 us of "
               "CPU: eight processes at the default, 80,000 spans/s, took 0.7-0.8 of a core with no "
               "loss on a 2-core VM, where the whole agent holds ~120,000 spans/s; sixteen lost a quarter "
               "of their spans at the exporter's queue, counted (docs/benchmarks.md). "
              "0: a span for every call (beyond that rate records are dropped, counted). Allocation, "
              "free and cudaSetDevice calls always get a span (the allocation table needs every one).",
        min=0, max=1_000_000_000)
    always_span_slower_than: float = doc(
        0.001, "Calls (cudaMemcpy*, cuda*Synchronize) at least this long always get a span, over the "
               "rate limit: the slow ones are the ones worth a trace. A thread cannot make more "
               "than 1/this such calls per second. 0: no exception.", duration=True)
    max_call_keys: int = doc(
        4096, "Distinct (process, API, device, return code, copy kind) call counters in the kernel. "
              "Beyond it calls of new keys are not counted (reason=stats_map_full); their records, "
              "when they get one, still become spans.", min=1)
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)
    max_inflight: int = doc(
        16384, "Calls in progress tracked at once (entry seen, return not yet), over all threads "
               "and APIs. Beyond it calls are not traced, counted as reason=state_map_full.", min=1)
    max_threads: int = doc(
        65536, "Threads whose cudaSetDevice binding is remembered. Beyond it new bindings are "
               "lost (reason=state_map_full) and those threads' events carry no device.", min=1)
    max_launch_keys: int = doc(
        4096, "Distinct (process, device, grid size, block size, PyTorch operator, kernel) launch counters in "
              "the kernel. Beyond it launches of new shapes are not counted (reason=stats_map_full).", min=1)
    learn_device_for: float = doc(
        10.0, "How long to probe cudaGetDevice after attaching to processes that were already running with a "
              "libcudart loaded (run --pid, --all-processes, an agent restart), to learn the device of each "
              "thread that chose it before the agent was there (its cudaSetDevice was missed; without this it "
              "reads as device 0, CUDA's default, and NCCL spans get the wrong hw.id). PyTorch asks on nearly "
              "every operator, so busy threads are learned at once. Costs two probe hits per cudaGetDevice "
              "call (entry and return; ~0.6-1 us each on this project's VMs) of every process using those "
              "libraries, for this long only; threads learned stop paying the BPF part. 0: never (run -- "
              "COMMAND never needs it: every cudaSetDevice is seen).",
        duration=True, min=0)
    kernel_names: bool = doc(
        True, "Count launches per kernel and name them (gpu.cuda.kernel.launch.calls gets cuda.kernel.name, "
              "bounded by processors.cuda.kernel_name_limit): the launched function joins the in-kernel launch "
              "key (more keys: see max_launch_keys), and the calls that make kernel handles (__cudaGetKernel, "
              "cudaGetFuncBySymbol, cuModuleGetFunction, cuLibraryGetKernel: once per kernel) are probed. Names "
              "come from the ELF symbol table of the file holding the kernel's host function, read when first "
              "needed, or from the name the driver was asked for.")
    max_kernel_names: int = doc(
        65536, "Kernel handles and names remembered at once, over all processes (about 200 bytes each). Beyond "
               "it the least recently used go (reason=kernel_names_full); a later launch of theirs is named "
               "again from the symbol table, or not at all for a driver handle.", min=1)
    nesting: bool = doc(
        True, "Read, at each call's entry, the Python function / PyTorch operator the thread is in "
              "(written by the python and torch receivers of this agent into a map they share on "
              "bpffs), so CUDA spans become children of its span. Off: no shared map, no lookup.")
    launch_context: bool = doc(
        True, "With nesting: kernel launches read it too (one more hash lookup per launch), so "
              "gpu.cuda.kernel.launch.calls is counted per pytorch.op.name and sampled launch "
              "spans nest. Off: launches stay on the cheapest path.")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
