"""Builds the twin's libraries: stand-in libcudart.so.13 and libnccl.so.2, and the generated stubs.

``build()`` compiles with gcc (``-O2 -fno-omit-frame-pointer``: real bodies, frame pointers for the agent's
stack walks) against the real headers of the twin's environment, into a cache directory keyed by a digest
of every input (sources, headers, the torch wheel's library set, gcc's version, the flags). A complete build
is reused as is; a new one is made in a temporary directory and renamed into place, so concurrent callers
(pytest workers, two launches) never see half a build. After linking, every symbol torch imports from
libcudart and libnccl is checked to be exported: a torch that needs more fails here, by name.

Blocking (runs gcc, seconds); raises ``TwinBuildError`` (no compiler, a failed compile: its stderr) or
``TwinSetupError`` (from ``find_env``).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from otel_ebpf.twin import stubs
from otel_ebpf.twin.env import TwinEnv, find_env
from otel_ebpf.twin.errors import TwinBuildError

__all__ = ["CFLAGS", "PLUGIN_INCLUDE", "build", "default_cache_dir"]

HERE = Path(__file__).resolve().parent
CFLAGS = ["-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]
CUDART_SOURCES = ["cudart.c", "cudart_streams.c", "cudart_stream_api.c", "cudart_capture.c", "cudart_graphs.c",
                  "cudart_kernels.c"]
NCCL_SOURCES = ["nccl_comm.c", "nccl_split.c", "nccl_coll.c", "nccl_shm.c", "nccl_group.c", "nccl_p2p.c",
                "nccl_mem.c", "nccl_profiler.c", "nccl_prof_api.c", "nccl_prof_plan.c", "nccl_prof_order.c",
                "nccl_prof_proxy.c"]
# The profiler plugin API's headers as NCCL 2.28.9 gives them to plugin writers (ext-profiler/example/nccl/ of
# NVIDIA/nccl v2.28.9-1, unchanged, with NCCL's LICENSE.txt): the wheel ships no profiler header.
PLUGIN_INCLUDE = HERE / "include"
COMPLETE = ".complete"


def default_cache_dir() -> Path:
    """$OTEL_EBPF_TWIN_CACHE, else $XDG_CACHE_HOME/otel-ebpf/twin (~/.cache/otel-ebpf/twin)."""
    named = os.environ.get("OTEL_EBPF_TWIN_CACHE")
    if named:
        return Path(named)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "otel-ebpf" / "twin"


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise TwinBuildError("the twin's build needs gcc (apt-get install gcc; scripts/setup.sh installs it)")
    return gcc


def _digest(env: TwinEnv, gcc: str) -> str:
    h = hashlib.sha256()
    for path in sorted(HERE.glob("*.[ch]")) + sorted(HERE.glob("*.py")) + sorted(PLUGIN_INCLUDE.glob("nccl/*.h")):
        h.update(path.name.encode() + path.read_bytes())
    for header in (env.cuda_include / "cuda_runtime_api.h", env.nccl_include / "nccl.h"):
        h.update(header.read_bytes())
    for lib in stubs.torch_libraries(env.torch_dir):
        h.update(f"{lib.name}:{lib.stat().st_size}".encode())
    h.update(subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.encode())
    h.update(" ".join(CFLAGS).encode())
    return h.hexdigest()[:16]


def _cc(gcc: str, args: list[str], what: str) -> None:
    r = subprocess.run([gcc, *CFLAGS, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise TwinBuildError(f"gcc failed building {what}:\n{r.stderr.strip()[-4000:]}",
                             hint="a missing header means the twin's environment is incomplete: scripts/setup.sh")


def _exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}


def _imported_from_stand_ins(env: TwinEnv) -> dict[str, set[str]]:
    wanted: dict[str, set[str]] = {"libcudart.so.13": set(), "libnccl.so.2": set()}
    for lib in stubs.torch_libraries(env.torch_dir):
        for sym in stubs.undefined_symbols(lib):
            name, _, version = sym.partition("@")
            if version.lstrip("@") == "libcudart.so.13":
                wanted["libcudart.so.13"].add(name)
            elif not version and name.startswith("nccl"):
                wanted["libnccl.so.2"].add(name)
    return wanted


def _build_into(out: Path, env: TwinEnv, gcc: str) -> None:
    cuda = f"-I{env.cuda_include}"
    (out / "cudart.map").write_text("libcudart.so.13 { global: cuda*; __cuda*; local: *; };\n")
    _cc(gcc, [cuda, "-o", str(out / "libcudart.so.13"), *(str(HERE / s) for s in CUDART_SOURCES),
              "-Wl,-soname,libcudart.so.13", f"-Wl,--version-script={out / 'cudart.map'}", "-lpthread"],
        "libcudart.so.13 (cudart*.c)")
    # Real NCCL links cudart statically; here it shares torch's stand-in, so the current device is one state.
    _cc(gcc, ["-fvisibility=hidden", f"-I{env.nccl_include}", cuda, f"-I{PLUGIN_INCLUDE}", "-o",
              str(out / "libnccl.so.2"), *(str(HERE / s) for s in NCCL_SOURCES), "-Wl,-soname,libnccl.so.2",
              f"-L{out}", "-l:libcudart.so.13", "-lpthread", "-ldl"], "libnccl.so.2 (nccl_*.c)")
    plan = stubs.plan_stubs(env.torch_dir)
    overrides = (HERE / "stub_overrides.c").read_text()
    for soname, source, script in stubs.write_stub_sources(plan, overrides, out):
        _cc(gcc, ["-w", "-o", str(out / soname), str(source), f"-Wl,-soname,{soname}",
                  f"-Wl,--version-script={script}"], f"the stub {soname}")
    for soname, names in _imported_from_stand_ins(env).items():
        missing = sorted(names - _exported(out / soname))
        if missing:
            raise TwinBuildError(f"torch in {env.venv} imports from {soname} what the stand-in lacks: {missing}")


def build(env: TwinEnv | None = None, cache_dir: Path | None = None) -> Path:
    """The directory holding the twin's libraries (LD_LIBRARY_PATH for a twin run), built if not cached."""
    env = env or find_env()
    gcc = _gcc()
    for tool in ("nm", "readelf"):
        if shutil.which(tool) is None:
            raise TwinBuildError(f"the twin's build needs `{tool}` (apt-get install binutils)")
    root = cache_dir or default_cache_dir()
    final = root / _digest(env, gcc)
    if (final / COMPLETE).exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        _build_into(tmp, env, gcc)
        (tmp / COMPLETE).write_text("")
        try:
            tmp.rename(final)
        except OSError:  # another build finished first: theirs is as good
            if not (final / COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
