/* One rank making non-blocking split children the way PyTorch 2.11 does (TORCH_NCCL_USE_COMM_NONBLOCKING=1),
 * on the twin's stand-in libnccl.so.2 (linked; LD_LIBRARY_PATH names the twin's libraries).
 *
 * torch/csrc/distributed/c10d/NCCLUtils.cpp (2.11): NCCLComm::create passes config.blocking = 0 to
 * ncclCommInitRankConfig and waits on ncclCommGetAsyncError; NCCLComm::split calls
 * ncclCommSplit(parent, color, key, &comm->ncclComm_, &config) with comm a fresh heap NCCLComm, waits for
 * the parent to leave ncclInProgress (ncclCommGetAsyncError), then polls comm->ncclComm_ until NCCL's thread
 * has stored the child there. A 2-D DeviceMesh makes its children dim by dim ("dp" then "tp" here) and
 * tensor parallel uses tp first. A third child ("unused") is destroyed without ever being used.
 *
 * Prints "ready pid=N", waits for a line on stdin, then prints
 * "child NAME newcomm=0x.. handle=0x.." for each child and "done". Exit code 0 when every call succeeded.
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct torch_comm {  /* as NCCLComm: the handle is a member of the child's own heap object */
    int rank;
    ncclComm_t handle;
};

static int wait_ready(ncclComm_t comm)
{
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 100000 && state == ncclInProgress; i++) {
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
            return 1;
        if (state == ncclInProgress)
            usleep(100);
    }
    return state != ncclSuccess;
}

static struct torch_comm *split(ncclComm_t parent, ncclConfig_t *config)
{
    struct torch_comm *c = calloc(1, sizeof(*c));
    if (c == NULL || ncclCommSplit(parent, 0, 0, &c->handle, config) != ncclSuccess || wait_ready(parent))
        return NULL;
    for (int i = 0; i < 100000 && __atomic_load_n(&c->handle, __ATOMIC_ACQUIRE) == NULL; i++)
        usleep(100);
    return c->handle != NULL ? c : NULL;
}

int main(void)
{
    char line[16];
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 2;
    ncclUniqueId id;
    ncclComm_t world;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 3;
    ncclResult_t rc = ncclCommInitRankConfig(&world, 1, id, 0, &config);
    if ((rc != ncclSuccess && rc != ncclInProgress) || wait_ready(world))
        return 4;
    struct torch_comm *dp = split(world, &config), *tp = split(world, &config), *unused = split(world, &config);
    if (dp == NULL || tp == NULL || unused == NULL)
        return 5;
    const char *names[] = {"dp", "tp", "unused"};
    struct torch_comm *children[] = {dp, tp, unused};
    for (int i = 0; i < 3; i++)
        printf("child %s newcomm=%p handle=%p\n", names[i], (void *)&children[i]->handle,
               (void *)children[i]->handle);
    float buf[4] = {1, 2, 3, 4};
    struct torch_comm *order[] = {tp, tp, dp};  /* tp used first, twice */
    for (int i = 0; i < 3; i++) {
        rc = ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, order[i]->handle, NULL);
        if ((rc != ncclSuccess && rc != ncclInProgress) || wait_ready(order[i]->handle))
            return 6;
    }
    for (int i = 0; i < 3; i++) {
        rc = ncclCommDestroy(children[i]->handle);
        if (rc != ncclSuccess && rc != ncclInProgress)
            return 7;
    }
    rc = ncclCommDestroy(world);
    if (rc != ncclSuccess && rc != ncclInProgress)
        return 8;
    printf("done\n");
    return 0;
}
