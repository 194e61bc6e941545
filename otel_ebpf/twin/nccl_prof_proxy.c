/*
 * Stand-in libnccl.so.2 for the twin, part 9: the profiler's kernel-channel events, as NCCL 2.28.9 makes them.  Not
 * NVIDIA's code.  Follows src/device/common.h (profiler(START/STOP): per channel, the kernel writes
 * workStarted/workCompleted[channel].data[workCounter % MAX_PROFILER_EVENTS_PER_CHANNEL] = { %globaltimer, counter }),
 * src/transport/profiler.cc profilerProxyProgress (the proxy thread starts a KernelCh event once the channel's
 * started counter reaches the sub's workCounter, with that timestamp as pTimer; once the completed counter does,
 * records ncclProfilerKernelChStop with the end timestamp, then stops it) and src/proxy.cc ncclProxyProgress (one
 * progress thread per communicator, started when the first proxy op needs it; it runs until stopped and drained,
 * or at once when the comm is aborted).
 *
 * The twin's "kernel" is the stream worker running the group (nccl_group.c group_job_run), and its %globaltimer is
 * CLOCK_REALTIME in ns (a GPU's globaltimer counts ns too, from an epoch of its own; the agent converts it in one
 * place): each channel of a collective starts when the worker starts the collective and stops when it has finished
 * it, a send's or recv's when the worker starts the group's point-to-point phase and when that operation's last
 * byte has moved (the twin moves an operation's channels together, on one thread).  A group stopped by an abort
 * stamps what it did not finish at its end, as NCCL's kernel still runs profiler(FINI) on its way out.
 *
 * The proxy thread looks at its subs whenever the stream worker stamps a channel (or a new op is posted) and sleeps
 * on a condition variable in between (at most 1 ms).  NCCL's spins with sched_yield; on the twin the "GPU" is a
 * thread of the same few CPUs, and a 20 us poll per communicator cost the traced FSDP2 step 1.5x (docs/benchmarks.md).
 * The events, their timestamps (read from the slots) and their thread are the same either way.  It emits no ProxyCtrl, ProxyOp or ProxyStep events (NCCL's come from network
 * transfers and the progress loop's states, which the twin does not model).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_prof.h"

#define RING 64 /* MAX_PROFILER_EVENTS_PER_CHANNEL, src/include/device.h */

struct slot { uint64_t counter, ts; }; /* struct ncclDevProfiler's data[] */

/* A kernel-channel sub as profilerProxyProgress keeps it (ncclProxySubArgs: base, posted, transmitted). */
struct sub {
    void *ctx, *parent, *handle;
    uint64_t base;
    uint8_t ch;
    int started;
};

struct twin_prof_proxy {
    struct slot started[TWIN_NCHANNELS][RING], completed[TWIN_NCHANNELS][RING]; /* comm->profiler.workStarted/... */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sub *posted;
    int nposted, cap, running, stop;
    uint64_t kicks; /* channel stamps so far: the proxy waits for the next one (under mu) */
    pthread_t thread;
    struct ncclComm *comm;
};

static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t twin_prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

struct twin_prof_proxy *twin_prof_proxy_of(struct ncclComm *c)
{
    struct twin_prof_proxy *p = __atomic_load_n(&c->prof.proxy, __ATOMIC_ACQUIRE);
    if (p != NULL)
        return p;
    pthread_mutex_lock(&create_mu);
    if ((p = c->prof.proxy) == NULL && (p = calloc(1, sizeof(*p))) != NULL) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
        p->comm = c;
        __atomic_store_n(&c->prof.proxy, p, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&create_mu);
    return p;
}

/* ncclProfilerStartKernelChEvent: rank is left 0, as NCCL leaves it. */
static void kernel_ch_start(struct sub *s, uint64_t ptimer)
{
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileKernelCh;
    d.parentObj = s->parent;
    d.kernelCh.channelId = s->ch;
    d.kernelCh.pTimer = ptimer;
    twin_profiler->startEvent(s->ctx, &s->handle, &d);
}

/* ncclProfilerStopKernelChEvent */
static void kernel_ch_stop(struct sub *s, uint64_t ptimer)
{
    ncclProfilerEventStateArgs_v5_t a;
    if (s->handle == NULL)
        return;
    memset(&a, 0, sizeof(a));
    a.kernelCh.pTimer = ptimer;
    twin_profiler->recordEventState(s->handle, ncclProfilerKernelChStop, &a);
    twin_profiler->stopEvent(s->handle);
}

/* profilerProxyProgress over the open subs: 1 if any moved.  A sub started now is looked at again next pass
 * ("allow events on every channel to start"). */
static int progress(struct twin_prof_proxy *p, struct sub *subs, int *n)
{
    int moved = 0, k = 0;
    for (int i = 0; i < *n; i++) {
        struct sub *s = &subs[i];
        struct slot *st = &p->started[s->ch][s->base % RING], *done = &p->completed[s->ch][s->base % RING];
        int finished = 0;
        if (!s->started && s->base <= __atomic_load_n(&st->counter, __ATOMIC_ACQUIRE)) {
            kernel_ch_start(s, __atomic_load_n(&st->ts, __ATOMIC_RELAXED));
            s->started = moved = 1;
        } else if (s->started && s->base <= __atomic_load_n(&done->counter, __ATOMIC_ACQUIRE)) {
            kernel_ch_stop(s, __atomic_load_n(&done->ts, __ATOMIC_RELAXED));
            finished = moved = 1;
        }
        if (!finished)
            subs[k++] = *s;
    }
    *n = k;
    return moved;
}

static int aborted(const struct twin_prof_proxy *p) { return __atomic_load_n(&p->comm->aborted, __ATOMIC_ACQUIRE); }

/* Sleep until the next stamp, a post, a stop or an abort: at most 1 ms (a stamp's wake-up may be missed by
 * nothing but a race the timeout covers). */
static void wait_for_stamp(struct twin_prof_proxy *p, uint64_t *seen)
{
    struct timespec until;
    pthread_mutex_lock(&p->mu);
    if (p->kicks == *seen && p->nposted == 0 && !p->stop && !aborted(p)) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&p->cv, &p->mu, &until);
    }
    *seen = p->kicks;
    pthread_mutex_unlock(&p->mu);
}

static void *proxy_main(void *arg)
{
    struct twin_prof_proxy *p = arg;
    struct sub *active = NULL;
    int nactive = 0, cap = 0;
    uint64_t seen = 0;
    for (;;) {
        int quit;
        pthread_mutex_lock(&p->mu);
        while (p->nposted == 0 && nactive == 0 && !p->stop && !aborted(p))
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->nposted > 0 && nactive + p->nposted > cap) { /* ncclProxyGetPostedOps */
            struct sub *grown = realloc(active, sizeof(*grown) * (size_t)(nactive + p->nposted));
            if (grown != NULL) {
                active = grown;
                cap = nactive + p->nposted;
            }
        }
        if (p->nposted > 0 && nactive + p->nposted <= cap) {
            memcpy(active + nactive, p->posted, sizeof(*active) * (size_t)p->nposted);
            nactive += p->nposted;
            p->nposted = 0;
        }
        quit = aborted(p) || (p->stop && nactive == 0 && p->nposted == 0);
        pthread_mutex_unlock(&p->mu);
        if (quit)
            break;
        if (!progress(p, active, &nactive))
            wait_for_stamp(p, &seen);
    }
    free(active);
    return NULL;
}

void twin_prof_proxy_post(const struct prof_op *op)
{
    struct twin_prof_proxy *p = op->comm->prof.proxy;
    if (p == NULL || op->wc[0] == 0)
        return;
    pthread_mutex_lock(&p->mu);
    if (!p->stop && p->nposted + op->nch > p->cap) {
        int cap = 2 * (p->nposted + op->nch);
        struct sub *grown = realloc(p->posted, sizeof(*grown) * (size_t)cap);
        if (grown != NULL) {
            p->posted = grown;
            p->cap = cap;
        }
    }
    for (int i = 0; !p->stop && i < op->nch && p->nposted < p->cap; i++)
        p->posted[p->nposted++] = (struct sub){ .ctx = op->comm->prof.ctx, .parent = op->event, .base = op->wc[i],
                                                .ch = twin_channel_of(op, i) };
    if (!p->stop && !p->running && pthread_create(&p->thread, NULL, proxy_main, p) == 0)
        p->running = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void twin_prof_proxy_stop(struct ncclComm *c)
{
    struct twin_prof_proxy *p = __atomic_load_n(&c->prof.proxy, __ATOMIC_ACQUIRE);
    int running;
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    running = p->running;
    p->running = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (running)
        pthread_join(p->thread, NULL);
}

void twin_prof_comm_free(struct ncclComm *c)
{
    struct twin_prof_proxy *p = c->prof.proxy;
    free(c->prof.name);
    c->prof.name = NULL;
    if (p != NULL) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p->posted);
        free(p);
        c->prof.proxy = NULL;
    }
}

/* profiler(START) / profiler(STOP) for the channels of `task`'s kernel-channel-enabled NCCL tasks. */
static void stamp(struct prof_stamp *s, int stop, uint64_t now)
{
    struct twin_prof_proxy *p = s->comm->prof.proxy;
    struct slot *slot;
    if (p == NULL || s->wc == 0 || (stop ? s->stopped : s->started))
        return;
    slot = stop ? &p->completed[s->ch][s->wc % RING] : &p->started[s->ch][s->wc % RING];
    __atomic_store_n(&slot->ts, now, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->counter, s->wc, __ATOMIC_RELEASE);
    *(stop ? &s->stopped : &s->started) = 1;
    pthread_mutex_lock(&p->mu); /* the proxy thread looks at its subs again */
    p->kicks++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void twin_prof_stamp(struct twin_prof_job *job, int task, int stop)
{
    uint64_t now;
    if (job == NULL)
        return;
    now = twin_prof_now();
    for (int i = 0; i < job->nstamps; i++)
        if (job->stamps[i].task == task)
            stamp(&job->stamps[i], stop, now);
}

void twin_prof_stamp_rest(struct twin_prof_job *job)
{
    uint64_t now;
    if (job == NULL)
        return;
    now = twin_prof_now();
    for (int i = 0; i < job->nstamps; i++) {
        stamp(&job->stamps[i], 0, now);
        stamp(&job->stamps[i], 1, now);
    }
}

void twin_prof_job_free(struct twin_prof_job *job)
{
    if (job != NULL) {
        twin_prof_group_free(job->replay);
        free(job);
    }
}
