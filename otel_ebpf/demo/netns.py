"""The demo's "nodes": one network namespace each, joined to the root namespace by a veth pair.

Node ``i`` of run ``R`` (``R`` = the demo process's PID in hex, so a dead run's leftovers can be
recognised and removed by the next run):

* network namespace ``oe-demo-R-i`` (``/run/netns/oe-demo-R-i``), ``lo`` up;
* veth ``oeRh<i>`` in the root namespace with ``10.213.i.1/30``, its peer ``oeRn<i>`` in the
  node's namespace with ``10.213.i.2/30``: node ``i`` reaches the gateway at ``10.213.i.1``.

Nothing else is ever configured: no default route, no forwarding, no other address, so a
node can talk to the root namespace's ``10.213.i.1`` and to its own loopback only. Every
function here shells out to iproute2 (``ip``) with a timeout and raises
:class:`~otel_ebpf.core.errors.OtelEbpfError` naming the command and its stderr; :func:`destroy`
never raises (it is called from ``finally``).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.core.errors import EnvironmentError_, OtelEbpfError

__all__ = ["MAX_NODES", "NETNS_PREFIX", "NodeNet", "create", "destroy", "remove_stale", "run_alive", "run_id"]

NETNS_PREFIX = "oe-demo-"
NETNS_DIR = Path("/run/netns")
MAX_NODES = 64  # 10.213.<i>.0/30 for i < 64; the third octet leaves room, the host's CPUs do not
_NETNS_RE = re.compile(rf"^{NETNS_PREFIX}([0-9a-f]+)-(\d+)$")
_LINK_RE = re.compile(r"^\d+:\s+(oe([0-9a-f]+)[hn]\d+)(?:@\S+)?:")
_TIMEOUT_S = 10
# Sets the (new, unshared) UTS namespace's host name, then execs the rest of argv. Python
# rather than hostname(1), which minimal images lack.
_SET_HOSTNAME = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"


def run_id(pid: int | None = None) -> str:
    """This run's id: the PID of the demo process, in hex."""
    return format(os.getpid() if pid is None else pid, "x")


@dataclass(frozen=True)
class NodeNet:
    """One node's namespace and addresses."""

    run: str
    index: int

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.run}-{self.index}"

    @property
    def host_if(self) -> str:
        return f"oe{self.run}h{self.index}"

    @property
    def node_if(self) -> str:
        return f"oe{self.run}n{self.index}"

    @property
    def host_addr(self) -> str:
        """The root namespace's end: where this node's agent sends OTLP."""
        return f"10.213.{self.index}.1"

    @property
    def node_addr(self) -> str:
        return f"10.213.{self.index}.2"

    @property
    def hostname(self) -> str:
        return f"node-{self.index}"

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node: its network namespace and a new UTS namespace whose
        host name is :attr:`hostname` (so the agent's ``host.name`` differs per node).

        ``nsenter --net`` rather than ``ip netns exec``: the latter also remounts /sys for the
        namespace, which hides tracefs (/sys/kernel/tracing) and BCC then cannot compile the
        tracepoint programs (``incomplete definition of type 'struct tracepoint__...'``).
        """
        return ["unshare", "--uts", "--", "nsenter", f"--net={NETNS_DIR / self.netns}", "--",
                sys.executable, "-c", _SET_HOSTNAME, self.hostname, *argv]


def _ip(*args: str, check: bool = True) -> str:
    cmd = ["ip", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise EnvironmentError_("the demo needs iproute2's 'ip' command",
                                hint="install iproute2 (e.g. apt-get install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise OtelEbpfError(f"'{shlex.join(cmd)}' did not finish in {_TIMEOUT_S}s") from None
    if check and proc.returncode != 0:
        raise OtelEbpfError(f"'{shlex.join(cmd)}' failed: {proc.stderr.strip()}")
    return proc.stdout


def run_alive(run: str) -> bool:
    """Whether the demo process that owns run ``run`` still runs (not this process)."""
    try:
        pid = int(run, 16)
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except (ValueError, OSError):
        return False
    return pid != os.getpid() and b"demo" in cmdline


def _check_addresses() -> None:
    """Refuse to run where 10.213.0.0/16 is in use by something that is not a demo's veth."""
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].startswith("10.213.") and not re.match(r"^oe[0-9a-f]+h\d+$", fields[1]):
            raise EnvironmentError_(f"10.213.0.0/16, which the demo's nodes use, is already assigned here "
                                    f"({fields[3]} on {fields[1]})",
                                    hint="run the demo on a host (or VM, container) where that range is free")


def remove_stale() -> list[str]:
    """Delete the namespaces and veths of demo runs whose process is gone (killing what still
    runs inside them: agents and ranks orphaned by a SIGKILLed demo); return their names.

    Raises OtelEbpfError when another demo is running (both would use 10.213.0.0/16),
    EnvironmentError_ when the range is taken by something else.
    """
    removed: list[str] = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NETNS_RE.match(name)
        if not m:
            continue
        if run_alive(m.group(1)):
            raise OtelEbpfError(f"another otel-ebpf demo is running (pid {int(m.group(1), 16)}, namespace "
                                    f"{name}); both would use 10.213.0.0/16",
                                    hint="wait for it to finish, or stop it with Ctrl+C")
        for pid in _ip("netns", "pids", name, check=False).split():  # a dead run's orphaned agents and ranks
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, OSError):
                pass
        _ip("netns", "del", name, check=False)
        removed.append(name)
    for line in _ip("-o", "link", "show").splitlines():
        m = _LINK_RE.match(line)
        if m and not run_alive(m.group(2)) and m.group(2) != run_id():
            _ip("link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    _check_addresses()
    return removed


def create(run: str, nodes: int) -> list[NodeNet]:
    """Create every node's namespace and veth pair. On a failure, what was made is removed and
    the error re-raised."""
    made: list[NodeNet] = []
    try:
        for i in range(nodes):
            node = NodeNet(run, i)
            made.append(node)
            _ip("netns", "add", node.netns)
            _ip("link", "add", node.host_if, "type", "veth", "peer", "name", node.node_if, "netns", node.netns)
            _ip("addr", "add", f"{node.host_addr}/30", "dev", node.host_if)
            _ip("link", "set", node.host_if, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.node_addr}/30", "dev", node.node_if)
            _ip("-n", node.netns, "link", "set", node.node_if, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
    except BaseException:
        destroy(made)
        raise
    return made


def destroy(nodes: list[NodeNet]) -> list[str]:
    """Delete the nodes' namespaces (which deletes their veth ends, and so the pairs) and any
    root-side veth left behind. Never raises; returns what could not be removed."""
    left: list[str] = []
    for node in nodes:
        for args in (("netns", "del", node.netns), ("link", "del", node.host_if)):
            try:
                _ip(*args, check=False)
            except OtelEbpfError:
                pass
        if (NETNS_DIR / node.netns).exists():
            left.append(node.netns)
    return left
