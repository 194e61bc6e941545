/*
 * Chaining for libnccl-profiler-otel_ebpf (chain.c): the user's own profiler plugin, named by
 * OTEL_EBPF_NCCL_PROFILER_CHAIN and resolved as NCCL resolves NCCL_PROFILER_PLUGIN, sits behind ours and
 * receives every call NCCL would have made to it, with its own handles, parents and contexts.
 *
 * Handles (plugin.c): OE_HANDLE(n, recorded, type index), n from oe_seq; never 0 and never a pointer. When
 * chaining, a handle whose event the chained plugin also started owns the ring slot n % OE_RING, which maps it to
 * the chained plugin's handle; the slot keeps that mapping after the event stopped, because NCCL 2.28.9 names
 * stopped events as parents (src/plugin/profiler.cc: a Coll's parentObj is its CollApi event, stopped in
 * collTaskAppend; a KernelCh's is its Coll, stopped in hostStreamPlanTask before the proxy thread starts the
 * channel), until 2^18 handles later. A slot's tag is checked (seqlock), so an older parent maps to NULL, never to
 * another event's handle.
 */
#ifndef OE_NCCL_CHAIN_H
#define OE_NCCL_CHAIN_H

#include "nccl/profiler.h"

#define OE_TYPE_BITS 4 /* ncclProfile* bit index, 0..14 */
#define OE_REC_BIT (1ull << OE_TYPE_BITS) /* set: the event fired its start probe */
#define OE_SEQ_SHIFT (OE_TYPE_BITS + 1)
#define OE_HANDLE(n, rec, idx) (((uint64_t)(n) << OE_SEQ_SHIFT) | ((rec) ? OE_REC_BIT : 0) | (uint64_t)(idx))
#define OE_HANDLE_TYPE(h) (1ull << ((h) & ((1u << OE_TYPE_BITS) - 1)))
#define OE_RING_BITS 18

extern uint64_t oe_seq;  /* the next handle number (atomic), shared by plugin.c and chain.c */
extern int oe_chain_on;  /* 1 once a chained plugin is loaded: set before NCCL's first event, never cleared */

/* Logs through the logger NCCL gave the last init (NCCL_LOG_INFO/WARN, subsystem NCCL_INIT); no-op without one. */
void oe_log(ncclDebugLogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void oe_set_logger(ncclDebugLogger_t logfn);

/* Loads OTEL_EBPF_NCCL_PROFILER_CHAIN's plugin once per process (first call wins; later calls return at once).
 * nccl_version: the table NCCL called us through (5 or 6); self5/self6: our own tables, never chained. */
void oe_chain_load(int nccl_version, const void *self5, const void *self6);

/* The chained plugin's current activation mask (it may rewrite it, as NCCL lets it), CE bits removed where NCCL
 * or the chained plugin predates them. 0 without a chain. */
int oe_chain_mask_now(void);

/* Per communicator: *cctx and *ok are what the chained init gave; failures are logged once, never returned. */
void oe_chain_init(void **cctx, int *ok, uint64_t commId, const char *commName, int nNodes, int nranks, int rank,
                   ncclDebugLogger_t logfn);
void oe_chain_finalize(void *cctx, int ok);

/* Starts the event at the chained plugin when NCCL would have (its mask; see chain.c), with parents translated;
 * returns its handle, or NULL. dsize: the size of NCCL's descriptor (v5 or v6). */
void *oe_chain_start(void *cctx, int ok, const ncclProfilerEventDescr_v5_t *d, size_t dsize);

/* A handle for an event with chained handle ch (claims a ring slot); 0 when every slot tried is held by a live
 * event (then the chained event is stopped at once and dropped). */
uint64_t oe_chain_alloc(int recorded, unsigned idx, void *ch);

void oe_chain_stop(uint64_t h);
void oe_chain_record(uint64_t h, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v5_t *args);

#endif
