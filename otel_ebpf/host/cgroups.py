"""Container id and Kubernetes pod UID from ``/proc/PID/cgroup`` text (cgroup v1 or v2).

Pure functions of the text, thread-safe; nothing here reads ``/proc`` (see
:mod:`otel_ebpf.host.processes`). Paths are as seen from the reader's cgroup namespace.
"""
from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["container_id_from_cgroup", "pod_uid_from_cgroup"]

# One path segment naming a container: docker (cgroupfs ``<id>``, systemd ``docker-<id>.scope``),
# containerd (``cri-containerd-<id>.scope``), CRI-O (``crio-<id>.scope``), podman
# (``libpod-<id>.scope``). ``crio-conmon-`` / ``libpod-conmon-`` are the monitor processes beside
# the container, not in it, and do not match.
_CONTAINER_SEGMENT = re.compile(r"^(?:(?:docker|cri-containerd|crio|libpod|containerd)-)?([0-9a-f]{64})"
                                r"(?:\.scope)?$")
# ``pod<uid>`` (cgroupfs driver) or ``kubepods-<qos>-pod<uid_with_underscores>.slice`` (systemd
# driver, also ``kubelet-kubepods-…`` on kind/k3s); a prefix must name kubepods. Static pods have
# a 32-hex UID, no dashes.
_POD_UID = re.compile(r"(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
                      r"|[0-9a-f]{32})(?:\.slice)?$")


def _cgroup_paths(text: str) -> list[str]:
    """The path of every ``hierarchy-ID:controllers:path`` line, in file order."""
    return [parts[2] for parts in (line.split(":", 2) for line in text.splitlines()) if len(parts) == 3]


def _pod_segment(segment: str) -> re.Match[str] | None:
    m = _POD_UID.search(segment)
    return m if m and (m.start() == 0 or "kubepods" in segment[:m.start()]) else None


def _last_segment_match(text: str, match: Callable[[str], re.Match[str] | None]) -> str | None:
    for path in _cgroup_paths(text):
        found = [m.group(1) for m in map(match, path.split("/")) if m]
        if found:
            return found[-1]  # innermost, e.g. docker-in-docker
    return None


def container_id_from_cgroup(text: str) -> str | None:
    """The 64-hex container id in ``/proc/PID/cgroup`` text (v1 or v2), or None on the host.

    The first line (file order) that names a container wins; within it, the innermost segment.
    Paths are as seen from the reader's cgroup namespace: run the agent in the host's one.
    """
    return _last_segment_match(text, _CONTAINER_SEGMENT.match)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The Kubernetes pod UID in ``/proc/PID/cgroup`` text, with dashes, or None outside a pod."""
    uid = _last_segment_match(text, _pod_segment)
    return uid.replace("_", "-") if uid else None


