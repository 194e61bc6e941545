/*
 * Stand-in libnccl.so.2 for the twin, part 3b: point-to-point data movement.  Not NVIDIA's library.
 *
 * Send/recv move the bytes through one bounded ring per (comm, sender, receiver) at the end of the comm's
 * staging area (OTEL_EBPF_TWIN_P2P_KB, default 1024 KiB each); messages of any size stream through it.  As
 * in NCCL 2.28.9 (src/enqueue.cc p2pTaskAppend queues sends and recvs per peer in call order), the k-th send from
 * A to B matches B's k-th recv from A; zero-count sends and recvs are operations too and match each other.
 * Each message carries its size ahead of it, so a recv whose count differs from the matched send's fails
 * with ncclInvalidUsage instead of reading the next message's bytes (NCCL leaves that undefined).  A group's
 * sends and recvs progress together on the stream's worker (nccl_group.c group_job_run -> twin_run_p2p).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_twin.h"

/* One ring: `head` bytes ever written by the sender, `tail` bytes ever read by the receiver. */
struct ring {
    uint64_t head;
    char pad1[56];
    uint64_t tail;
    char pad2[56];
    char data[];
};

static size_t ring_capacity(void)
{
    static size_t cap;
    if (cap == 0) {
        const char *s = getenv("OTEL_EBPF_TWIN_P2P_KB");
        long kb = s != NULL ? atol(s) : 1024;
        cap = (size_t)(kb > 0 ? kb : 1024) << 10;
    }
    return cap;
}

static size_t ring_bytes(void) { return sizeof(struct ring) + ring_capacity(); }

size_t twin_mailbox_bytes(int nranks) { return ring_bytes() * (size_t)nranks * (size_t)nranks; }

/* The ring carrying src -> dst, at the end of the staging area (nccl_coll.c twin_shm_open sizes it). */
static struct ring *ring_of(const struct ncclComm *c, int src, int dst)
{
    char *boxes = c->shm.base + c->shm.len - twin_mailbox_bytes(c->nranks);
    return (struct ring *)(boxes + ((size_t)src * (size_t)c->nranks + (size_t)dst) * ring_bytes());
}

/* Moves up to n bytes into (send) or out of (!send) the ring; returns how many moved. */
static size_t ring_move(struct ring *r, int send, char *buf, size_t n)
{
    size_t cap = ring_capacity();
    uint64_t head = __atomic_load_n(&r->head, send ? __ATOMIC_RELAXED : __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(&r->tail, send ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
    size_t room = send ? cap - (size_t)(head - tail) : (size_t)(head - tail);
    size_t k = n < room ? n : room, at = (size_t)((send ? head : tail) % cap), first = cap - at;
    if (k == 0)
        return 0;
    first = first < k ? first : k;
    if (send) {
        memcpy(r->data + at, buf, first);
        memcpy(r->data, buf + first, k - first);
        __atomic_store_n(&r->head, head + k, __ATOMIC_RELEASE);
    } else {
        memcpy(buf, r->data + at, first);
        memcpy(buf + first, r->data, k - first);
        __atomic_store_n(&r->tail, tail + k, __ATOMIC_RELEASE);
    }
    return k;
}

/* Advances one send or recv as far as the ring allows: 1 when it is complete, 0 when not yet, -1 on a
 * size mismatch.  The stream of one message is its 8-byte size, then the payload. */
static int p2p_progress(struct twin_task *t)
{
    int send = t->kind == TWIN_SEND, me = t->comm->rank;
    size_t n = t->count * twin_type_size(t->type);
    struct ring *r = send ? ring_of(t->comm, me, t->root) : ring_of(t->comm, t->root, me);
    if (send && t->done == 0)
        t->hdr = n;
    while (t->done < sizeof(t->hdr) + n) {
        size_t at = t->done, moved;
        if (at < sizeof(t->hdr))
            moved = ring_move(r, send, (char *)&t->hdr + at, sizeof(t->hdr) - at);
        else
            moved = ring_move(r, send, (send ? (char *)t->send : (char *)t->recv) + (at - sizeof(t->hdr)),
                              n - (at - sizeof(t->hdr)));
        if (moved == 0)
            return 0;
        t->done += moved;
        if (!send && at < sizeof(t->hdr) && t->done == sizeof(t->hdr) && t->hdr != n)
            return -1;
    }
    return 1;
}

/* Runs every send and recv together until all are complete (ncclRemoteError when a comm is aborted).  Sends
 * (recvs) to (from) one peer on one comm share a ring, so they move in call order: one starts when the one
 * before it is complete (NCCL 2.28.9 src/enqueue.cc p2pTaskAppend queues them per peer, in order), or a later
 * recv would read an earlier message's bytes, and a later send would write into the middle of one. */
ncclResult_t twin_run_p2p(struct twin_task *tasks, int ntasks, struct twin_prof_job *prof)
{
    int left = 0;
    for (int i = 0; i < ntasks; i++) {
        struct twin_task *t = &tasks[i];
        t->after = -1;
        if (t->kind == TWIN_COLL)
            continue;
        left++;
        twin_prof_stamp(prof, i, 0); /* the kernel's channels start the p2p phase together */
        for (int j = i - 1; j >= 0 && t->after < 0; j--)
            if (tasks[j].kind == t->kind && tasks[j].comm == t->comm && tasks[j].root == t->root)
                t->after = j;
    }
    long polls = 0;
    for (long idle = 0; left > 0;) {
        int moved = 0;
        for (int i = 0; i < ntasks; i++) {
            struct twin_task *t = &tasks[i];
            size_t before = t->done;
            int st;
            if (t->kind == TWIN_COLL || t->done == SIZE_MAX)
                continue;
            if (t->after >= 0 && tasks[t->after].done != SIZE_MAX)
                continue; /* the message before it on this ring is not through yet */
            if (__atomic_load_n(&t->comm->aborted, __ATOMIC_ACQUIRE))
                return ncclRemoteError;
            if ((st = p2p_progress(t)) < 0) {
                twin_set_last_error("otel-ebpf twin: ncclRecv count differs from the matching ncclSend's");
                return ncclInvalidUsage;
            }
            moved |= t->done != before;
            if (st == 1) {
                t->done = SIZE_MAX;
                left--;
                twin_prof_stamp(prof, i, 1);
            }
        }
        idle = moved ? 0 : idle + 1;
        if (idle > 200) {
            for (int i = 0; i < ntasks; i++)
                if (tasks[i].kind != TWIN_COLL && tasks[i].done != SIZE_MAX)
                    twin_peer_check(tasks[i].comm, &polls);
            usleep(50);
        }
        else if (idle > 0)
            sched_yield();
    }
    return ncclSuccess;
}
