/*
 * Stand-in libnccl.so.2 for the twin, part 4: buffer registration, NCCL-allocated memory and the device API
 * probes.  Not NVIDIA's library.  Prototypes from NCCL 2.28.9's nccl.h; "device" memory is host memory
 * (cudart.c), so a registration handle or window is the buffer itself.
 */
#include <stdlib.h>

#include "nccl_twin.h"

/* ---- buffer registration and NCCL-allocated memory: "device" memory is host memory (cudart.c) ---- */

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    (void)size;
    if (!twin_comm_ok(comm) || handle == NULL)
        return ncclInvalidArgument;
    *handle = buff;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle)
{
    (void)handle;
    return twin_comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
         int winFlags)
{
    (void)size; (void)winFlags;
    if (!twin_comm_ok(comm) || win == NULL)
        return ncclInvalidArgument;
    *win = (ncclWindow_t)buff;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    return twin_comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
    if (ptr == NULL)
        return ncclInvalidArgument;
    return posix_memalign(ptr, 4096, size ? size : 1) == 0 ? ncclSuccess : ncclSystemError;
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr)
{
    free(ptr);
    return ncclSuccess;
}

/* The device-side API (nccl_device.h, C++ only, so these two prototypes are not checked against it):
 * torch probes it for symmetric memory; refused, torch then does not use it. */
struct ncclDevCommRequirements;
struct ncclDevComm;
__attribute__((visibility("default"))) ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                                                       const struct ncclDevCommRequirements *reqs,
                                                                       struct ncclDevComm *out)
{
    (void)comm; (void)reqs; (void)out;
    twin_set_last_error("otel-ebpf twin: the NCCL device API is not modelled");
    return ncclInvalidUsage;
}

__attribute__((visibility("default"))) ncclResult_t ncclDevCommDestroy(ncclComm_t comm,
                                                                        const struct ncclDevComm *devComm)
{
    (void)comm; (void)devComm;
    return ncclSuccess;
}
