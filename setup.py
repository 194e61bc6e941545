"""Packages and the optional C extensions; everything else lives in pyproject.toml.

Every package is under ``otel_ebpf/`` (receivers and processors included: the top-level folders
mapped with ``package-dir`` hid them from import-linter, docs/architecture.md "Code layout").
"""
import os

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

packages = find_packages(include=["otel_ebpf", "otel_ebpf.*"])

# The application tracepoints SDK's USDT probe site (needs sys/sdt.h: apt systemtap-sdt-dev).
oetp = Extension("otel_ebpf.tracepoints._oetp", sources=["otel_ebpf/tracepoints/_oetp.c"], extra_compile_args=["-O2"],
                 optional=True)  # without it every tracepoint stays disabled (otel_ebpf.tracepoints.AVAILABLE)

# The OTLP span encoders, protobuf and JSON (otel_ebpf/emit/otlp_native.py; without them the same bytes are written
# in Python).
otlpenc = Extension("otel_ebpf.emit._otlpenc", sources=[f"otel_ebpf/emit/_otlpenc{part}.c" for part in
                                                    ("", "_read", "_values", "_spans", "_jvalues", "_json",
                                                     "_records")],
                    depends=["otel_ebpf/emit/_otlpenc.h"],
                    extra_compile_args=["-O2", "-fno-strict-aliasing", "-std=gnu11", "-fvisibility=hidden"], optional=True)

# OTLP/protobuf trace requests decoded into SDK spans (otel_ebpf/emit/otlp_in.py; without it the parsed request is
# converted in Python).
otlpdec = Extension("otel_ebpf.emit._otlpdec", sources=["otel_ebpf/emit/_otlpdec.c"],
                    extra_compile_args=["-O2", "-fno-strict-aliasing", "-std=gnu11", "-fvisibility=hidden"],
                    optional=True)

# BPF ring buffers read in C through libbcc's libbpf manager, records handed to Python a batch at a time
# (otel_ebpf/bpf/ringread.py; without it BCC's per-record ctypes callbacks read them).
ringread = Extension("otel_ebpf.bpf._ringread", sources=["otel_ebpf/bpf/_ringread.c"],
                     extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"], optional=True)

# Ring-buffer records decoded in C into the receivers' typed events (otel_ebpf/bpf/records.py; without it each record
# is decoded by its receiver's Python decode).
recdec = Extension("otel_ebpf.bpf._recdec", sources=["otel_ebpf/bpf/_recdec.c"],
                   depends=["otel_ebpf/core/_slots.h"],
                   extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"], optional=True)

# Frozen records made from positional values in C (otel_ebpf/core/frozen.py maker; without it the class is called).
frozen = Extension("otel_ebpf.core._frozen", sources=["otel_ebpf/core/_frozen.c"],
                   depends=["otel_ebpf/core/_slots.h"],
                   extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"], optional=True)

# The collective join's common case, a rank span that only joins its pending collective, taken in C
# (otel_ebpf/processors/collective_join/intake.py; without it the join's Python path takes every span).
join_intake = Extension("otel_ebpf.processors.collective_join._intake",
                        sources=["otel_ebpf/processors/collective_join/_intake.c"], depends=["otel_ebpf/core/_slots.h"],
                        extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"], optional=True)

# The NCCL profiler plugin (docs/nccl-profiler.md): a plain shared library NCCL dlopens, not a Python module, so it
# keeps NCCL's file name libnccl-profiler-otel_ebpf.so (NCCL_PROFILER_PLUGIN=otel_ebpf finds it on the loader path)
# next to otel_ebpf/nccl_profiler/__init__.py, which locates it. Also needs sys/sdt.h; without it plugin_path() is None.
NCCL_PLUGIN = "libnccl-profiler-otel_ebpf"
nccl_plugin = Extension(
    f"otel_ebpf.nccl_profiler.{NCCL_PLUGIN}",
    sources=["otel_ebpf/nccl_profiler/plugin.c", "otel_ebpf/nccl_profiler/chain.c"],
    depends=["otel_ebpf/nccl_profiler/chain.h", "otel_ebpf/nccl_profiler/probes.h",
             "otel_ebpf/nccl_profiler/nccl/profiler.h"],
    extra_compile_args=["-O2", "-fno-omit-frame-pointer", "-fno-strict-aliasing", "-fvisibility=hidden",
                        "-std=gnu11"],
    libraries=["dl"],  # dlopen/dlsym: in libc since glibc 2.34, libdl before
    optional=True,
)


class BuildExt(build_ext):
    """build_ext that names the plugin NCCL's way (no Python ABI suffix, no PyInit_ export)."""

    def get_ext_filename(self, fullname: str) -> str:
        parts = fullname.split(".")
        if parts[-1] == NCCL_PLUGIN:
            return os.path.join(*parts[:-1], NCCL_PLUGIN + ".so")
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return [] if ext is nccl_plugin else super().get_export_symbols(ext)


setup(packages=packages, ext_modules=[oetp, otlpenc, otlpdec, ringread, recdec, frozen, join_intake, nccl_plugin], cmdclass={"build_ext": BuildExt})
