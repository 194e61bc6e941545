"""The BPF runtime shared by every eBPF receiver: the receiver base (load, attach, poll),
raw bpf(2) calls, the pause-on-load map and its guard, the per-thread context map, the kernel
clock, and the C every program starts with (include/).
"""
