/*
 * Stand-in libnccl.so.2 for the twin, part 2b: a communicator's shared-memory staging area
 * ($OTEL_EBPF_TWIN_DIR/comm-<hash>), its barriers, its bootstrap exchange and the dead-peer check (nccl_twin.h
 * declares each).  Not NVIDIA's library.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nccl_twin.h"

#define HEADER_BYTES (64 << 10)
#define MAX_PEERS 2048

/* The header: the barrier of the comm's stream work, the barrier of its bootstrap (splits run on the host
 * thread while stream work may run: NCCL's bootstrap is its own socket network, src/bootstrap.cc), each
 * rank's pid and node (written by the rank at twin_shm_open), then the bootstrap's exchange area. */
struct shm_barrier { uint32_t count; uint32_t gen; uint32_t pad[14]; };
struct shm_peer { int32_t pid; uint32_t node; };
struct shm_header {
    struct shm_barrier work, boot;
    struct shm_peer peers[MAX_PEERS];
    char boot_data[];
};
#define BOOT_BYTES (HEADER_BYTES - sizeof(struct shm_header))

static size_t slot_size(void)
{
    const char *s = getenv("OTEL_EBPF_TWIN_SLOT_MB");
    long mb = s != NULL ? atol(s) : 16;
    return (size_t)(mb > 0 ? mb : 16) << 20;
}

ncclResult_t twin_shm_open(struct ncclComm *c)
{
    const char *dir = getenv("OTEL_EBPF_TWIN_DIR");
    char path[512];
    size_t slot = slot_size(), len = HEADER_BYTES + slot * (size_t)c->nranks;
    void *p;
    int fd;

    snprintf(path, sizeof(path), "%s/comm-%016llx", dir != NULL ? dir : "/dev/shm", (unsigned long long)c->hash);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        twin_set_last_error("otel-ebpf twin: cannot create the communicator's staging file under $OTEL_EBPF_TWIN_DIR");
        if (fd >= 0)
            close(fd);
        return ncclSystemError;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return ncclSystemError;
    c->shm = (struct twin_shm){ p, len, slot };
    if ((size_t)c->rank < MAX_PEERS) {
        struct shm_header *h = p;
        const char *node = getenv("OTEL_EBPF_TWIN_NODE");
        c->node = node != NULL ? (uint32_t)atoi(node) : 0;
        h->peers[c->rank] = (struct shm_peer){ (int32_t)getpid(), c->node };
    }
    return ncclSuccess;
}

void twin_shm_close(struct ncclComm *c)
{
    if (c->shm.base != NULL)
        munmap(c->shm.base, c->shm.len);
    c->shm.base = NULL;
}

char *twin_slot(const struct ncclComm *c, int rank) { return c->shm.base + HEADER_BYTES + (size_t)rank * c->shm.slot; }
size_t twin_slot_bytes(const struct ncclComm *c) { return c->shm.slot; }

/* Whether process `pid` has exited (gone, or a zombie its parent has not reaped yet). */
static int pid_gone(int32_t pid)
{
    char path[64], buf[256], *close_paren;
    ssize_t n;
    int fd;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = '\0';
    close_paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and parentheses */
    return close_paren != NULL && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

void twin_peer_check(struct ncclComm *c, long *polls)
{
    const struct shm_header *h = (const struct shm_header *)c->shm.base;
    ncclResult_t ok = ncclSuccess;
    /* callers poll every ~50 us once idle: look every 2048 polls (~100 ms plus the loop's own time) */
    if (((*polls)++ & 2047) != 0 || (size_t)c->nranks > MAX_PEERS
        || __atomic_load_n(&c->async_result, __ATOMIC_ACQUIRE) != ncclSuccess)
        return;
    for (int r = 0; r < c->nranks; r++) {
        struct shm_peer peer = h->peers[r];
        if (r == c->rank || peer.pid <= 0 || peer.node == c->node || !pid_gone(peer.pid))
            continue;
        if (__atomic_compare_exchange_n(&c->async_result, &ok, ncclRemoteError, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE) && twin_trace_on())
            fprintf(stderr, "[twin nccl %d] comm %p: rank %d (pid %d, node %u) exited: ncclRemoteError\n",
                    (int)getpid(), (void *)c, r, (int)peer.pid, peer.node);
        return;
    }
}

/* Sense-reversing barrier: the last rank to arrive resets the count and bumps the generation. */
static ncclResult_t barrier_on(struct ncclComm *c, struct shm_barrier *h)
{
    uint32_t g = __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&h->count, 1, __ATOMIC_ACQ_REL) == (uint32_t)c->nranks) {
        __atomic_store_n(&h->count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&h->gen, 1, __ATOMIC_RELEASE);
        return ncclSuccess;
    }
    for (long i = 0, polls = 0; __atomic_load_n(&h->gen, __ATOMIC_ACQUIRE) == g; i++) {
        if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
            return ncclRemoteError;
        if (i < 200) {
            sched_yield();
        } else {
            twin_peer_check(c, &polls);
            usleep(50);
        }
    }
    return ncclSuccess;
}

ncclResult_t twin_barrier(struct ncclComm *c) { return barrier_on(c, &((struct shm_header *)c->shm.base)->work); }

ncclResult_t twin_allgather_bytes(struct ncclComm *c, const void *mine, void *all, size_t n)
{
    struct shm_header *h = (struct shm_header *)c->shm.base;
    ncclResult_t rc;
    if (n * (size_t)c->nranks > BOOT_BYTES) {
        twin_set_last_error("otel-ebpf twin: too many ranks for the bootstrap exchange area");
        return ncclInternalError;
    }
    memcpy(h->boot_data + (size_t)c->rank * n, mine, n);
    if ((rc = barrier_on(c, &h->boot)) != ncclSuccess)
        return rc;
    memcpy(all, h->boot_data, n * (size_t)c->nranks);
    return barrier_on(c, &h->boot);
}
