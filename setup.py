"""Package list for the layout in STYLE.md: ``receivers/`` and ``processors/`` at the top of the
repository are installed as ``otel_ebpf.receivers`` and ``otel_ebpf.processors``.

setuptools' package discovery does not apply ``package-dir`` mappings (it would install them as
top-level ``receivers``/``processors``), so the mapped packages are listed here explicitly.
Everything else lives in pyproject.toml.
"""
from setuptools import Extension, find_packages, setup

packages = find_packages(include=["otel_ebpf", "otel_ebpf.*"])
for top in ("receivers", "processors"):
    packages.append(f"otel_ebpf.{top}")
    packages += [f"otel_ebpf.{top}.{p}" for p in find_packages(where=top)]

# The application tracepoints SDK's USDT probe site (needs sys/sdt.h: apt systemtap-sdt-dev).
oetp = Extension("otel_ebpf.tracepoints._oetp", sources=["otel_ebpf/tracepoints/_oetp.c"], extra_compile_args=["-O2"],
                 optional=True)  # without it every tracepoint stays disabled (otel_ebpf.tracepoints.AVAILABLE)

setup(packages=packages, ext_modules=[oetp])
