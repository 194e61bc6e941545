"""Where otel-ebpf's NCCL profiler plugin is, and the environment that makes a job load it.

``libnccl-profiler-otel_ebpf.so`` (``plugin.c``, ``chain.c``; docs/nccl-profiler.md) is built by setup.py next
to this file, into the wheel and, with ``pip install -e .`` (scripts/setup.sh), into the source tree. NCCL loads
it when the job's environment has ``NCCL_PROFILER_PLUGIN=<path>`` (or ``otel_ebpf`` with the folder on the
loader path); it turns NCCL's profiler events into the USDT probes of ``probes.h`` (provider ``otel_ebpf_nccl``),
which cost one branch per NCCL group while no agent is attached.

A user's own profiler plugin keeps working behind ours: :func:`launch_env` moves a ``NCCL_PROFILER_PLUGIN``
that names another plugin to ``OTEL_EBPF_NCCL_PROFILER_CHAIN``, which ours loads (resolved as NCCL resolves
``NCCL_PROFILER_PLUGIN``) and forwards every call to.

Nothing here imports anything but the standard library and :mod:`otel_ebpf.core.errors`; nothing is cached, so
a plugin built after import is found.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from otel_ebpf.core.errors import EnvironmentError_

__all__ = ["CHAIN_ENV", "LIBRARY_NAME", "NCCL_ENV", "PLUGIN_NAME", "PROBES", "PROBES_HEADER", "PROVIDER",
           "launch_env", "plugin_path", "require_plugin"]

#: the name NCCL resolves (``NCCL_PROFILER_PLUGIN=otel_ebpf`` -> libnccl-profiler-otel_ebpf.so) and the
#: ``name`` field of the plugin's ncclProfiler_v5/v6 tables
PLUGIN_NAME = "otel_ebpf"
LIBRARY_NAME = f"libnccl-profiler-{PLUGIN_NAME}.so"
#: NCCL's variable (NCCL 2.28.9 src/plugin/profiler.cc ncclProfilerPluginLoad) and ours for the chained plugin
NCCL_ENV = "NCCL_PROFILER_PLUGIN"
CHAIN_ENV = "OTEL_EBPF_NCCL_PROFILER_CHAIN"
#: the USDT provider and probe names, as in probes.h (the contract with the NCCL receiver)
PROVIDER = "otel_ebpf_nccl"
PROBES = ("comm_init", "comm_finalize", "group_start", "api_start", "coll_start", "p2p_start", "kernel_ch_start",
          "kernel_ch_stop", "event_stop")
PROBES_HEADER = Path(__file__).with_name("probes.h")

_HERE = Path(__file__).resolve().parent


def plugin_path() -> Path | None:
    """The built plugin (an absolute path), or None when it was not built (setup.py builds it only where a C
    compiler and sys/sdt.h exist). Thread-safe; reads the file system each call."""
    path = _HERE / LIBRARY_NAME
    return path if path.is_file() else None


def require_plugin() -> Path:
    """:func:`plugin_path`, or :class:`~otel_ebpf.core.errors.EnvironmentError_` saying why there is none and how
    to build it."""
    path = plugin_path()
    if path is None:
        raise EnvironmentError_(
            f"the NCCL profiler plugin {LIBRARY_NAME} is not built (looked in {_HERE})",
            hint="it needs gcc and sys/sdt.h (apt install gcc systemtap-sdt-dev); then reinstall otel-ebpf "
                 "(scripts/setup.sh, or pip install . from the checkout)")
    return path


def _names_us(value: str, ours: Path) -> bool:
    if value in (PLUGIN_NAME, LIBRARY_NAME):
        return True
    try:
        return Path(value).resolve() == ours.resolve()
    except OSError:
        return False


def launch_env(environ: Mapping[str, str], plugin: Path | None = None) -> dict[str, str]:
    """The variables to set in a job's environment so that its NCCL loads our plugin: ``NCCL_PROFILER_PLUGIN``
    = the plugin's path, and, when ``environ`` already named another plugin there (and no chain is set), that
    value as ``OTEL_EBPF_NCCL_PROFILER_CHAIN``. ``none`` (NCCL's "no plugin") is not chained. ``plugin``: the
    library to name (default :func:`require_plugin`, which raises when it is not built). Pure: reads only its
    arguments and the file system."""
    ours = plugin if plugin is not None else require_plugin()
    env = {NCCL_ENV: str(ours)}
    user = environ.get(NCCL_ENV, "").strip()
    if user and user.lower() != "none" and not _names_us(user, ours) and not environ.get(CHAIN_ENV):
        env[CHAIN_ENV] = user
    return env
