"""otel_ebpf/host/symbols: function names of addresses in live processes (ELF .symtab/.dynsym), and the short
names of mangled kernels. The ELF files are built here by gcc; the live process is this test's own child."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.host.symbols import AddressSymbolizer, ElfFunctions, short_function_name

LIB_C = r"""
__attribute__((noinline)) int _ZN2at6native29vectorized_elementwise_kernelILi4EEEviT_(int n) { return n + 1; }
__attribute__((noinline)) static int local_kernel(int n) { return n * 3; }
int (*keep_local)(int) = local_kernel;
__attribute__((noinline)) int plain_c_kernel(int n) { return n - 2; }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")  # scripts/setup.sh installs it; CI has it
    out = tmp_path_factory.mktemp("symbols")
    (out / "k.c").write_text(LIB_C)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out / "libk.so"), str(out / "k.c")],
                   check=True, capture_output=True, timeout=60)
    return out / "libk.so"


def _nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return {w[2]: int(w[0], 16) for w in (line.split() for line in out.splitlines()) if len(w) == 3}


def test_functions_of_symtab_are_found_by_any_address_inside_them(lib: Path) -> None:
    elf = ElfFunctions(str(lib))
    addr = _nm(lib)
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4EEEviT_"
    assert elf.name_at(addr[mangled]) == mangled
    assert elf.name_at(addr[mangled] + 1) == mangled  # inside the function
    assert elf.name_at(addr["local_kernel"]) == "local_kernel"  # a static function: .symtab only
    assert elf.name_at(addr["plain_c_kernel"]) == "plain_c_kernel"
    assert elf.name_at(0) is None


def test_stripped_file_falls_back_to_dynsym(lib: Path, tmp_path: Path) -> None:
    stripped = tmp_path / "libk-stripped.so"
    subprocess.run(["strip", "-o", str(stripped), str(lib)], check=True, timeout=60)
    elf = ElfFunctions(str(stripped))
    addr = _nm(lib)
    assert elf.name_at(addr["plain_c_kernel"]) == "plain_c_kernel"  # exported
    assert elf.name_at(addr["local_kernel"]) in (None, "plain_c_kernel")  # gone with .symtab: never its own name


def test_not_an_elf_file_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"not an elf" * 10)
    with pytest.raises(ValueError):
        ElfFunctions(str(junk))


@contextlib.contextmanager
def mapping_child(lib: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A child that maps ``lib`` and waits: (the child, plain_c_kernel's run-time address in it). It exits when
    the block ends."""
    code = ("import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); "
            "print(ctypes.cast(l.plain_c_kernel, ctypes.c_void_p).value, flush=True); sys.stdin.readline()")
    child = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        yield child, int(child.stdout.readline())
    finally:
        child.communicate("\n", timeout=30)


def test_live_process_addresses_are_named_and_still_after_it_exits(lib: Path) -> None:
    """A child maps the library and prints a function's run-time address; the symbolizer names it, and once it
    has read the child's mappings it still names it after the child is gone."""
    with mapping_child(lib) as (child, addr):
        sym = AddressSymbolizer()
        sym.remember(child.pid)
        assert sym.name(child.pid, addr) == "plain_c_kernel"
        assert sym.name(child.pid, 8) is None  # no mapping there
    assert sym.name(child.pid, addr) == "plain_c_kernel"  # from the mappings read while it lived
    sym.forget(child.pid)
    assert sym.name(child.pid, addr) is None
    assert AddressSymbolizer().name(child.pid, addr) is None  # never seen alive: unknown, no error


def test_a_process_exiting_between_stat_and_open_still_gets_its_name(lib: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/PID/root goes with the process: a stat of the file through it may succeed and the open fail. The
    file is then read through the agent's own view, and the failed open is not remembered as 'no ELF' (a
    fresh-clone CI run found kernels unnamed this way)."""
    import otel_ebpf.host.symbols as symbols

    real = symbols.ElfFunctions
    opened: list[str] = []

    def gone_under_proc(path: str) -> ElfFunctions:
        opened.append(path)
        if path.startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path)

    with mapping_child(lib) as (child, addr):
        sym = AddressSymbolizer()
        sym.remember(child.pid)
        monkeypatch.setattr(symbols, "ElfFunctions", gone_under_proc)
        assert sym.name(child.pid, addr) == "plain_c_kernel"
        assert opened == [f"/proc/{child.pid}/root{lib}", str(lib)]
    monkeypatch.setattr(symbols, "ElfFunctions", real)
    flaky = AddressSymbolizer()
    flaky.remember(os.getpid())
    libc_addr = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    assert libc_addr is not None
    calls = iter([OSError("gone"), OSError("gone")])

    def fails_once_per_view(path: str) -> ElfFunctions:
        err = next(calls, None)
        if err is not None:
            raise err
        return real(path)

    monkeypatch.setattr(symbols, "ElfFunctions", fails_once_per_view)
    assert flaky.name(os.getpid(), libc_addr) is None  # both views failed to open this time
    assert flaky.name(os.getpid(), libc_addr) is not None  # ... and the next call reads the file


def test_this_process_libc_function_is_named() -> None:
    libc = ctypes.CDLL(None)
    addr = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert addr is not None
    import os

    name = AddressSymbolizer().name(os.getpid(), addr)
    assert name is not None and "getpid" in name


@pytest.mark.parametrize(("mangled", "short"), [
    # from torch 2.11's libtorch_cuda.so (nm)
    ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
     "at::native::vectorized_elementwise_kernel"),
    ("_ZN2at6nativeL16triu_tril_kernelIsiLb0ELi4ELb1EEEvNS_4cuda6detail10TensorInfoIT_T0_EENS4_IKS5_S6_EEllS6_",
     "at::native::triu_tril_kernel"),
    ("_ZN2at6native56_GLOBAL__N__651dfe0c_17_DistanceKernel_cu_ef1a7132_1794826cdist_backward_kernel_implIdEEvPT_",
     "at::native::(anonymous namespace)::cdist_backward_kernel_impl"),
    ("_ZN13pytorch_flashL24flash_fwd_splitkv_kernelI23Flash_fwd_kernel_traitsILi32EEEEvNS_15Flash_fwd_paramsE",
     "pytorch_flash::flash_fwd_splitkv_kernel"),
    ("_Z71__device_stub__ZN2at6native8internal24unique_bool_write_outputEiPKiPbPliPKiPbPl",
     "at::native::internal::unique_bool_write_output"),
    ("_Z10add_kernelPfS_i", "add_kernel"),
    ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector"),
    ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),  # Triton's, given to cuModuleGetFunction
    ("_ZN9broken", "_ZN9broken"),  # unreadable: as it is
])
def test_short_names_drop_template_arguments_and_parameters(mangled: str, short: str) -> None:
    assert short_function_name(mangled) == short
