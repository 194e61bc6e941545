/* Record of the application tracepoints program (otel_ebpf/receivers/apptrace): one per fire of the USDT
 * probe otel_ebpf:event (otel_ebpf/tracepoints/_oetp.c). Starts with a u8 type (145, in the
 * user-probes range 144-159), has explicit padding, is zeroed before it is filled, and has
 * exactly one Python mirror (otel_ebpf/receivers/apptrace/receiver.py RECORD, checked by
 * tests/unit/test_apptrace.py). 376 bytes. */
#ifndef OE_APPTRACE_H
#define OE_APPTRACE_H

#define AT_EV_EVENT 145
#define AT_PROVIDER_LEN 32
#define AT_NAME_LEN 32
#define AT_PAYLOAD_LEN 256

struct at_rec {
    u8 type;
    u8 kind;           /* 0 point, 1 span begin, 2 span end */
    u8 _pad[2];
    u32 pid;
    u32 tid;
    u32 _pad2;
    u64 ts;            /* bpf_ktime_get_ns() */
    u64 trace_hi;      /* the app's trace id (0: none) */
    u64 trace_lo;
    u64 parent;        /* the app's current span id (0: none) */
    u64 span;          /* the SDK span's id (begin/end), 0 for points */
    char provider[AT_PROVIDER_LEN];
    char name[AT_NAME_LEN];
    char payload[AT_PAYLOAD_LEN]; /* JSON object of the probe's arguments */
};

#endif /* OE_APPTRACE_H */
