"""The records of nccl.h as Python reads them: one :class:`Layout` per record struct (checked against gcc's layout by
tests/unit/receivers/test_nccl_layout.py), the enumerations the records use, and the loss counters' names."""
from __future__ import annotations

import struct

from . import profiler as prof

__all__ = [
    "COLL", "COMM_BIND", "COMM_END", "COMM_INFO", "COMM_INIT", "COMM_INIT_ALL", "COMM_SHRINK", "COMM_SPLIT",
    "COUNTERS", "F_CAPTURED", "F_SEQ", "GROUP", "GROUP_F_CAPTURED", "GROUP_F_SIMULATED", "INFO_KINDS",
    "INIT_FUNCTIONS", "LAYOUTS", "OPS", "P2P", "PROF_COMM", "PROF_COMM_END", "PROF_KIND_COLL", "PROF_KIND_P2P",
    "PROF_OP", "SHRINK_MAX", "Layout"
]

# NCCL_OP_* in nccl.h, by value
OPS = ("AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AlltoAll", "Gather",
       "Scatter", "Send", "Recv")
INIT_FUNCTIONS = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable")
INFO_KINDS = ("nranks", "rank", "device")
F_SEQ = 1
F_CAPTURED = 2  # NCCL_F_CAPTURED
GROUP_F_SIMULATED = 1
GROUP_F_CAPTURED = 2
SHRINK_MAX = 64  # NCCL_SHRINK_MAX


class Layout:
    """The Python mirror of one record struct of nccl.h: (field, struct code) in order,
    padding included under its C name, little-endian with no implicit alignment."""

    def __init__(self, c_name: str, etype: int, *fields: tuple[str, str]) -> None:
        self.c_name, self.etype, self.fields = c_name, etype, fields
        fmt = "<"
        self.offsets: dict[str, int] = {}
        for name, code in fields:
            self.offsets[name] = struct.calcsize(fmt)
            fmt += code
        self.struct = struct.Struct(fmt)


_HEAD = (("pid", "I"), ("tid", "I"), ("rc", "i"))
COMM_INIT = Layout("nccl_comm_init", 32, ("type", "B"), ("kind", "B"), ("_pad", "2x"), *_HEAD,
                   ("nranks", "i"), ("rank", "i"), ("ts_start", "Q"), ("ts_end", "Q"), ("comm", "Q"),
                   ("id", "128s"))
COMM_INIT_ALL = Layout("nccl_comm_init_all", 33, ("type", "B"), ("_pad", "3x"), *_HEAD, ("ndev", "i"),
                       ("_pad2", "4x"), ("ts_start", "Q"), ("ts_end", "Q"), ("comms", "32Q"),
                       ("devs", "32i"))
COMM_SPLIT = Layout("nccl_comm_split", 34, ("type", "B"), ("_pad", "3x"), *_HEAD, ("color", "i"),
                    ("key", "i"), ("ts_start", "Q"), ("ts_end", "Q"), ("parent", "Q"), ("comm", "Q"), ("newcomm", "Q"))
COMM_END = Layout("nccl_comm_end", 35, ("type", "B"), ("kind", "B"), ("_pad", "2x"), *_HEAD,
                  ("ts_start", "Q"), ("ts_end", "Q"), ("comm", "Q"))
COMM_INFO = Layout("nccl_comm_info", 36, ("type", "B"), ("kind", "B"), ("_pad", "2x"), *_HEAD,
                   ("value", "i"), ("_pad2", "4x"), ("ts", "Q"), ("comm", "Q"))
COLL = Layout("nccl_coll", 37, ("type", "B"), ("op", "B"), ("flags", "B"), ("_pad", "x"), *_HEAD,
              ("datatype", "i"), ("redop", "i"), ("root", "i"), ("_pad2", "4x"), ("ts_start", "Q"),
              ("ts_end", "Q"), ("count", "Q"), ("comm", "Q"), ("stream", "Q"), ("seq", "Q"),
              ("group", "Q"), ("api", "Q"))
P2P = Layout("nccl_p2p", 38, ("type", "B"), ("op", "B"), ("flags", "B"), ("_pad", "x"), *_HEAD,
             ("datatype", "i"), ("peer", "i"), ("ts_start", "Q"), ("ts_end", "Q"), ("count", "Q"),
             ("comm", "Q"), ("stream", "Q"), ("seq", "Q"), ("group", "Q"), ("api", "Q"))
GROUP = Layout("nccl_group", 39, ("type", "B"), ("flags", "B"), ("_pad", "2x"), *_HEAD, ("members", "I"),
               ("p2p", "I"), ("ts_start", "Q"), ("ts_end", "Q"), ("group", "Q"))
COMM_SHRINK = Layout("nccl_comm_shrink", 40, ("type", "B"), ("_pad", "3x"), *_HEAD, ("nexcluded", "i"),
                     ("flags", "i"), ("ts_start", "Q"), ("ts_end", "Q"), ("parent", "Q"), ("comm", "Q"),
                     ("newcomm", "Q"), ("excluded", f"{SHRINK_MAX}i"))
COMM_BIND = Layout("nccl_comm_bind", 41, ("type", "B"), ("_pad", "3x"), ("pid", "I"), ("tid", "I"), ("_pad2", "4x"),
                   ("ts", "Q"), ("comm", "Q"), ("newcomm", "Q"))
_PROF_HEAD = (("type", "B"), ("_pad", "3x"), ("pid", "I"), ("tid", "I"), ("_pad2", "4x"), ("ts", "Q"))
PROF_COMM = Layout("nccl_prof_comm", 42, *_PROF_HEAD, ("context", "Q"), ("rec", f"{prof.COMM_REC.size}s"))
PROF_COMM_END = Layout("nccl_prof_comm_end", 43, *_PROF_HEAD, ("context", "Q"))
PROF_OP = Layout("nccl_prof_op", 44, ("type", "B"), ("kind", "B"), ("_pad", "2x"), ("pid", "I"), ("tid", "I"),
                 ("channels", "I"), ("ts", "Q"), ("handle", "Q"), ("gpu_start", "Q"), ("gpu_stop", "Q"),
                 ("rec", f"{prof.COLL_REC.size}s"))
PROF_KIND_COLL, PROF_KIND_P2P = 0, 1  # NCCL_PROF_KIND_*
LAYOUTS = (COMM_INIT, COMM_INIT_ALL, COMM_SPLIT, COMM_END, COMM_INFO, COLL, P2P, GROUP, COMM_SHRINK, COMM_BIND,
           PROF_COMM, PROF_COMM_END, PROF_OP)
# counters[] of nccl.bpf.c (NCCL_COUNTER_*) by index: "" are id counters, the rest losses by reason
COUNTERS = ("", "", "pending_unreadable", "gpu_ops_full", "gpu_channels_full")
