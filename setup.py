"""Package list for the layout in STYLE.md: ``receivers/`` and ``processors/`` at the top of the
repository are installed as ``otel_ebpf.receivers`` and ``otel_ebpf.processors``.

setuptools' package discovery does not apply ``package-dir`` mappings (it would install them as
top-level ``receivers``/``processors``), so the mapped packages are listed here explicitly.
Everything else lives in pyproject.toml.
"""
from setuptools import find_packages, setup

packages = find_packages(include=["otel_ebpf", "otel_ebpf.*"])
for top in ("receivers", "processors"):
    packages.append(f"otel_ebpf.{top}")
    packages += [f"otel_ebpf.{top}.{p}" for p in find_packages(where=top)]

setup(packages=packages)
