"""Namespace "nodes": one network namespace and host name each, all on one private switch.

Run slot ``k`` (0..63, claimed by an exclusive ``flock`` on ``/run/otel-ebpf/nodes-k.lock`` held for the
run, so runs in several processes coexist and a dead run's slot is recognised by its free lock)::

    root namespace                      switch namespace oe-twin-k-sw        node namespaces oe-twin-k-<i>
    oe<k>h 10.213.(128+k).1/24  <-veth->  oe<k>r ─┐
                                                  br0 (a Linux bridge)
                                        oe<k>s<i> ─┘  <-veth->  oe<k>n<i> 10.213.(128+k).(i+2)/24, lo up

Every node reaches every other node (torchrun's TCP rendezvous, a program's own sockets) and the root
namespace's ``10.213.(128+k).1`` (where the gateway listens), at layer 2 over the bridge; nothing is routed
and no sysctl is changed. The bridge lives in its own namespace so that the host's firewall (e.g. Docker's
``FORWARD`` policy DROP with ``br_netfilter`` loaded) never sees the nodes' traffic: the switch namespace's
own netfilter tables are empty. Nodes have no default route: they reach nothing else.

Every function shells out to iproute2 (``ip``) with a timeout and raises
:class:`~otel_ebpf.core.errors.OtelEbpfError` naming the command and its stderr; :meth:`Nodes.destroy` never
raises (it is called from ``finally``).
"""
from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from otel_ebpf.core.errors import EnvironmentError_, OtelEbpfError

__all__ = ["MAX_NODES", "NETNS_PREFIX", "Node", "Nodes", "create"]

NETNS_PREFIX = "oe-twin-"
NETNS_DIR = Path("/run/netns")
LOCK_DIR = Path("/run/otel-ebpf")
MAX_NODES = 64
SLOTS = 64  # concurrent runs on one host: 10.213.128.0/24 .. 10.213.191.0/24
_NET = "10.213"
_TIMEOUT_S = 10
# Sets the (new, unshared) UTS namespace's host name, then execs the rest of argv. Python rather than
# hostname(1), which minimal images lack.
_SET_HOSTNAME = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"


@dataclass(frozen=True)
class Node:
    """One node of a run in slot ``slot``: its namespace, address and host name ``node-<index>``."""

    slot: int
    index: int

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.slot}-{self.index}"

    @property
    def addr(self) -> str:
        """This node's address, reachable from every other node and from the root namespace."""
        return f"{_NET}.{128 + self.slot}.{self.index + 2}"

    @property
    def hostname(self) -> str:
        return f"node-{self.index}"

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node: its network namespace and a new UTS namespace whose host name is
        :attr:`hostname` (so an agent's ``host.name`` differs per node).

        ``nsenter --net`` rather than ``ip netns exec``: the latter also remounts /sys for the namespace,
        which hides tracefs (/sys/kernel/tracing) and BCC then cannot compile the tracepoint programs
        (``incomplete definition of type 'struct tracepoint__...'``).
        """
        return ["unshare", "--uts", "--", "nsenter", f"--net={NETNS_DIR / self.netns}", "--",
                sys.executable, "-c", _SET_HOSTNAME, self.hostname, *argv]


def _ip(*args: str, check: bool = True) -> str:
    cmd = ["ip", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise EnvironmentError_("namespace nodes need iproute2's 'ip' command",
                                hint="install iproute2 (e.g. apt-get install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise OtelEbpfError(f"'{shlex.join(cmd)}' did not finish in {_TIMEOUT_S}s") from None
    if check and proc.returncode != 0:
        raise OtelEbpfError(f"'{shlex.join(cmd)}' failed: {proc.stderr.strip()}")
    return proc.stdout


def _claim_slot() -> tuple[int, IO[bytes]]:
    """The first free slot and its held lock file; a slot whose lock is free belongs to no live run."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        fh = open(LOCK_DIR / f"nodes-{slot}.lock", "wb")  # held for the run
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return slot, fh
    raise EnvironmentError_(f"all {SLOTS} node slots are in use (runs holding {LOCK_DIR}/nodes-*.lock)",
                            hint="wait for other otel-ebpf demo/twin runs to finish")


def _remove_stale(slot: int) -> list[str]:
    """Delete what a dead run left in ``slot`` (ours now): its namespaces, killing the processes still in
    them, and its root-side veth. Returns their names."""
    removed: list[str] = []
    pattern = re.compile(rf"^{NETNS_PREFIX}{slot}-(\d+|sw)$")
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        if not pattern.match(name):
            continue
        for pid in _ip("netns", "pids", name, check=False).split():  # a dead run's orphaned agents and ranks
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, OSError):
                pass
        _ip("netns", "del", name, check=False)
        removed.append(name)
    if f"oe{slot}h" in _ip("-o", "link", "show").split(": "):
        _ip("link", "del", f"oe{slot}h", check=False)
        removed.append(f"oe{slot}h")
    run_dir = LOCK_DIR / f"run-{slot}"
    if run_dir.exists():  # a dead run's gateway (root namespace) names its config in this directory
        _kill_naming(str(run_dir).encode())
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(str(run_dir))
    return removed


def _kill_naming(needle: bytes) -> None:
    """SIGKILL every process whose command line contains ``needle`` (never this process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def _check_addresses(slot: int) -> None:
    """Refuse a slot whose subnet something else on the host uses."""
    prefix = f"{_NET}.{128 + slot}."
    for line in _ip("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].startswith(prefix):
            raise EnvironmentError_(f"{prefix}0/24, which namespace nodes use, is already assigned here "
                                    f"({fields[3]} on {fields[1]})",
                                    hint="run on a host (or VM, container) where 10.213.128.0/18 is free")


class Nodes:
    """The nodes of one run and the switch joining them. Owned by one thread; :meth:`destroy` is safe twice."""

    def __init__(self, slot: int, count: int, lock: IO[bytes], removed: list[str]) -> None:
        self.slot, self.lock, self.removed = slot, lock, removed
        self.nodes = [Node(slot, i) for i in range(count)]
        self.switch = f"{NETNS_PREFIX}{slot}-sw"
        self.run_dir = LOCK_DIR / f"run-{slot}"  # the run's private files (configs); removed by destroy

    @property
    def gateway_addr(self) -> str:
        """The root namespace's address on the switch: every node reaches it."""
        return f"{_NET}.{128 + self.slot}.1"

    def _make(self) -> None:
        s, sw = self.slot, self.switch
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        _ip("link", "add", f"oe{s}h", "type", "veth", "peer", "name", f"oe{s}r", "netns", sw)
        _ip("addr", "add", f"{self.gateway_addr}/24", "dev", f"oe{s}h")
        _ip("link", "set", f"oe{s}h", "up")
        _ip("-n", sw, "link", "set", f"oe{s}r", "master", "br0", "up")
        for node in self.nodes:
            port, inner = f"oe{s}s{node.index}", f"oe{s}n{node.index}"
            _ip("netns", "add", node.netns)
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", inner, "netns", node.netns)
            _ip("-n", sw, "link", "set", port, "master", "br0", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", inner)
            _ip("-n", node.netns, "link", "set", inner, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")

    def destroy(self) -> list[str]:
        """Delete the namespaces (which deletes their veth ends, and so the pairs) and the root-side veth,
        then release the slot. Never raises; returns the namespaces that could not be removed."""
        left: list[str] = []
        for name in [n.netns for n in self.nodes] + [self.switch]:
            try:
                _ip("netns", "del", name, check=False)
            except OtelEbpfError:
                pass
            if (NETNS_DIR / name).exists():
                left.append(name)
        try:
            _ip("link", "del", f"oe{self.slot}h", check=False)
        except OtelEbpfError:
            pass
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if not self.lock.closed:
            self.lock.close()
        return left


def create(count: int) -> Nodes:
    """Claim a slot, remove a dead run's leftovers in it, and create ``count`` nodes on a switch. On a
    failure, what was made is removed (and the slot released) before the error is raised."""
    if not 1 <= count <= MAX_NODES:
        raise ValueError(f"nodes must be 1..{MAX_NODES}, got {count}")
    slot, lock = _claim_slot()
    nodes = Nodes(slot, count, lock, [])
    try:
        nodes.removed = _remove_stale(slot)
        _check_addresses(slot)
        nodes.run_dir.mkdir(mode=0o700)
        nodes._make()
    except BaseException:
        nodes.destroy()
        raise
    return nodes
