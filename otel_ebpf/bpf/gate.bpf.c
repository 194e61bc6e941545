/* The library gate of a deferred start (otel_ebpf/bpf/gate.py): nothing but common.bpf.c's
 * traced set (followed through fork) and its library-open watch, with OE_PAUSE_ON_LOAD=1 and up
 * to four patterns (OE_LIB_PATTERN, OE_LIB_PATTERN2..4): a traced process opening the library of a
 * receiver that is still compiling is stopped until that receiver has attached to it. */
