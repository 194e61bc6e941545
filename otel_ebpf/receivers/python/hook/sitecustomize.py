"""Put on PYTHONPATH by ``otel-ebpf run`` when ``receivers.python.profile_hook`` is true.

CPython 3.11 to 3.14 fire the ``python:function__entry`` USDT probe only while a profile or trace
function is set (CPython gh-98894, fixed in 3.15); without it the python receiver sees returns
only and can time no call. This sets a do-nothing C profile function (``slice``: a C callable, so
no Python frame runs per call) for this interpreter's threads and those it starts, then runs the
``sitecustomize`` this file shadows, if any, so the environment's own one still applies.
Cost: ~0.1 us per Python call (docs/receivers.md). Nothing is done on other Python versions.
"""
import sys


def _otel_ebpf_profile_hook() -> None:
    if (3, 11) <= sys.version_info[:2] < (3, 15) and sys.getprofile() is None:
        import threading
        sys.setprofile(slice)
        threading.setprofile(slice)


def _otel_ebpf_chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_otel_ebpf_profile_hook()
_otel_ebpf_chain()
