"""otel_ebpf/receivers/cuda/kernels.py: a launch's func -> the kernel's short name, through the handle records of
__cudaGetKernel / cudaGetFuncBySymbol (a host function) and cuModuleGetFunction / cuLibraryGetKernel (a name), or
the func itself as a host function (CUDA 12's <<<>>>); bounded, and forgotten with the process."""
from __future__ import annotations

from otel_ebpf.host.symbols import AddressSymbolizer
from otel_ebpf.receivers.cuda.kernels import KernelNames

PID = 4242
HOST_FUN = 0x5000


class FakeSymbols(AddressSymbolizer):
    """Names one host function; counts lookups and the processes whose mappings were read."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0
        self.remembered: list[int] = []

    def remember(self, pid: int) -> None:
        self.remembered.append(pid)

    def name(self, pid: int, addr: int) -> str | None:
        self.lookups += 1
        return "_ZN2at6native13reduce_kernelILi512EEEvT_" if addr == HOST_FUN else None


def test_cuda13_handle_is_named_through_its_host_function() -> None:
    names = KernelNames(symbolizer=FakeSymbols())
    names.learn(PID, 0xAB00, HOST_FUN, "")
    assert names.name(PID, 0xAB00) == "at::native::reduce_kernel"
    assert names.name(PID + 1, 0xAB00) == ""  # handles are per process


def test_driver_function_is_named_by_the_name_asked_for() -> None:
    names = KernelNames(symbolizer=FakeSymbols())
    names.learn(PID, 0xCF00, 0, "triton_poi_fused_add_0")
    assert names.name(PID, 0xCF00) == "triton_poi_fused_add_0"


def test_cuda12_func_is_itself_the_host_function_and_lookups_are_cached() -> None:
    sym = FakeSymbols()
    names = KernelNames(symbolizer=sym)
    assert names.name(PID, HOST_FUN) == "at::native::reduce_kernel"
    assert names.name(PID, HOST_FUN) == "at::native::reduce_kernel" and sym.lookups == 1
    assert names.name(PID, 0x9999) == "" and names.name(PID, 0x9999) == "" and sym.lookups == 2


def test_bounded_least_recently_used_first_out() -> None:
    names = KernelNames(max_entries=2, symbolizer=FakeSymbols())
    names.learn(PID, 1, 0, "a")
    names.learn(PID, 2, 0, "b")
    assert names.name(PID, 1) == "a"  # 1 is now the most recent
    names.learn(PID, 3, 0, "c")
    assert (names.evicted, names.name(PID, 1), names.name(PID, 3)) == (1, "a", "c")
    assert names.name(PID, 2) == ""  # evicted: a driver handle cannot be named again


def test_a_process_is_read_once_and_forgotten_at_exit_or_exec() -> None:
    sym = FakeSymbols()
    names = KernelNames(symbolizer=sym)
    names.seen(PID)
    names.seen(PID)
    names.learn(PID, 7, 0, "k")
    assert sym.remembered == [PID]
    names.seen(PID, refresh=True)  # an exec: new mappings, old handles meaningless
    assert sym.remembered == [PID, PID] and names.name(PID, 7) == ""
    names.learn(PID, 7, 0, "k")
    names.forget(PID)
    assert names.name(PID, 7) == ""
