/* A model of NCCL 2.28.9's profiler-plugin side (nccl_sim.c): the calls NCCL makes into a profiler plugin, from the
 * threads, in the order and with the masks, parents and descriptors NCCL uses. No GPU, no transport: a "kernel" is a
 * list of channels the proxy thread reports started and finished, as src/transport/profiler.cc does. */
#ifndef NCCL_SIM_H
#define NCCL_SIM_H

#include "nccl/profiler.h"

/* src/include/nccl_common.h ncclFunc_t */
enum { ncclFuncAllReduce = 4, ncclFuncSend = 6, ncclFuncRecv = 7, ncclNumFuncs = 11 };
/* ext-profiler/example/nccl/types.h ncclDataType_t */
enum { ncclFloat32 = 7 };

struct sim_comm {
    void *profilerContext;
    uint64_t commHash;
    int rank, nRanks, nNodes;
    const char *commName;
    uint64_t seqNumber[ncclNumFuncs];
};

/* What the model does besides calling the plugin: trace every call (driver.c prints it) and where the proxy's
 * kernel-channel events run (its own thread, as NCCL; or inline, for the benchmark). */
struct sim_hooks {
    void (*trace_start)(const ncclProfilerEventDescr_v6_t *d, void *ctx, void *h, int proxy_thread);
    void (*trace_stop)(void *h, int proxy_thread);
    void (*trace_record)(void *h, int state, const ncclProfilerEventStateArgs_v5_t *args, int proxy_thread);
};

/* Loads the plugin as NCCL does (src/plugin/plugin_open.cc: dlopen RTLD_NOW|RTLD_LOCAL) and takes its table:
 * version 5 as NCCL 2.28.9 (ncclProfiler_v5 only), 6 as NCCL 2.29+ (ncclProfiler_v6, else v5). NULL path: no plugin
 * (NCCL without one). Returns 0 on success. */
int sim_load(const char *path, int version, const struct sim_hooks *hooks, int inline_proxy, ncclDebugLogger_t log);
void sim_unload(void);
int sim_mask(void); /* ncclProfilerEventMask */
void sim_ras_override(int mask); /* NCCL 2.32's job-wide override of it (ncclProfilerSetRasOverride) */

int sim_comm_init(struct sim_comm *comm);     /* ncclProfilerPluginInit */
void sim_comm_finalize(struct sim_comm *comm); /* ncclProfilerPluginFinalize */

void sim_group_start(void); /* ncclGroupStart */
void sim_group_end(void);   /* ncclGroupEnd: launches the group's plan, then waits for its kernel (the test's sync) */
void sim_all_reduce(struct sim_comm *comm, size_t count);
void sim_send(struct sim_comm *comm, size_t count, int peer);
void sim_recv(struct sim_comm *comm, size_t count, int peer);

#endif
