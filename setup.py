"""Packages and the optional C extension; everything else lives in pyproject.toml.

Every package is under ``otel_ebpf/`` (receivers and processors included: the top-level folders
mapped with ``package-dir`` hid them from import-linter, docs/architecture.md "Code layout").
"""
from setuptools import Extension, find_packages, setup

packages = find_packages(include=["otel_ebpf", "otel_ebpf.*"])

# The application tracepoints SDK's USDT probe site (needs sys/sdt.h: apt systemtap-sdt-dev).
oetp = Extension("otel_ebpf.tracepoints._oetp", sources=["otel_ebpf/tracepoints/_oetp.c"], extra_compile_args=["-O2"],
                 optional=True)  # without it every tracepoint stays disabled (otel_ebpf.tracepoints.AVAILABLE)

setup(packages=packages, ext_modules=[oetp])
