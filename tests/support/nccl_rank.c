/*
 * nccl_rank: one rank of a scripted NCCL job, calling libnccl.so.2 (the real
 * one or otel_ebpf/demo/stand_in_nccl.c) through dlopen/dlsym with KNOWN
 * argument values that probe tests assert on.  Needs no NCCL headers.
 *
 * Usage:
 *   nccl_rank LIBNCCL --rank R --nranks N --id-file PATH [--create-id]
 *             [--steps S] [--wait-stdin] [--delay-us D] [--split]
 *
 *   --create-id   ncclGetUniqueId, then write the 128 raw bytes to PATH
 *                 (PATH.tmp.PID, then rename: readers never see half an id).
 *                 Without it, wait up to 10 s for PATH and read it.
 *   --steps S     number of steps (default 1), see below.
 *   --wait-stdin  after dlopen+dlsym, print "ready pid=P" and block until one
 *                 line arrives on stdin (attach probes, then release).
 *   --delay-us D  set STAND_IN_NCCL_DELAY_US=D before dlopen: the stand-in
 *                 then sleeps D us in every collective (a straggler rank).
 *                 The real library ignores it.
 *   --split       after the steps: ncclCommSplit(comm, R % 2, R, &sub, NULL),
 *                 one ncclAllReduce(count 4096, ncclFloat32, ncclSum) on sub,
 *                 ncclCommDestroy(sub).
 *
 * Script, with T = host buffers from malloc (the stand-in touches them):
 *   ncclCommInitRank(&comm, N, id, R)
 *   for step in 0..S-1:
 *     ncclAllReduce(T, T, 1024 * (step + 1), ncclFloat32 = 7, ncclSum = 0, comm, NULL)
 *     ncclBroadcast(T, T, 256, ncclFloat16 = 6, root 0, comm, NULL)
 *     ncclAllGather(T, T, 100, ncclFloat64 = 8, comm, NULL)
 *     ncclReduceScatter(T, T, 64, ncclBfloat16 = 9, ncclMax = 2, comm, NULL)
 *     ncclGroupStart()
 *     ncclSend(T, 10, ncclInt32 = 2, (R + 1) % N, comm, NULL)
 *     ncclRecv(T, 10, ncclInt32 = 2, (R - 1 + N) % N, comm, NULL)
 *     ncclGroupEnd()
 *   [--split part]
 *   ncclCommDestroy(comm)
 *
 * Output (stdout, line buffered): one line per event, "NAME key=value ...":
 *   ready pid=P                     only with --wait-stdin
 *   ncclGetUniqueId rc=N            only with --create-id
 *   ncclCommInitRank rc=N
 *   <ncclFunction> rc=N step=S      for calls inside the steps
 *   <ncclFunction> rc=N             for the split part and the final destroy
 * Exit status: 0 when every call returned ncclSuccess; 2 when
 * ncclCommInitRank failed (the real library does without a GPU); 3 when a
 * later call failed; 1 on usage, dlopen/dlsym or id-file errors.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* nccl.h (NCCL 2.x) types and values, declared here. */
typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *cudaStream_t;
enum { ncclSum = 0, ncclMax = 2 };
enum { ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };

static struct {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, void *);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
} nccl;

struct options {
    const char *lib, *id_file;
    long rank, nranks, steps, delay_us;
    int create_id, wait_stdin, split;
};

static int failed;   /* a call after init returned non-zero */

static ncclResult_t report(const char *name, long step, ncclResult_t rc)
{
    if (step >= 0)
        printf("%s rc=%d step=%ld\n", name, rc, step);
    else
        printf("%s rc=%d\n", name, rc);
    if (rc != 0)
        failed = 1;
    return rc;
}

static void die(const char *what)
{
    fprintf(stderr, "nccl_rank: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(1);
}

/* ---- the id file ---- */

static void write_id(const char *path, const ncclUniqueId *id)
{
    char tmp[4096];
    int fd;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        die("id file path too long");
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die(tmp);
    if (write(fd, id, sizeof(*id)) != (ssize_t)sizeof(*id) || fsync(fd) != 0 || close(fd) != 0)
        die(tmp);
    if (rename(tmp, path) != 0)
        die(path);
}

static void read_id(const char *path, ncclUniqueId *id)
{
    struct timespec tick = { 0, 10 * 1000000L };
    int fd = -1;

    for (int i = 0; i < 1000 && fd < 0; i++) {   /* 1000 x 10 ms = 10 s */
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno != ENOENT)
            die(path);
        if (fd < 0)
            nanosleep(&tick, NULL);
    }
    if (fd < 0) {
        fprintf(stderr, "nccl_rank: %s did not appear within 10 s\n", path);
        exit(1);
    }
    if (read(fd, id, sizeof(*id)) != (ssize_t)sizeof(*id))
        die("short id file");
    close(fd);
}

/* ---- the script ---- */

struct buffers { char *send, *recv; };

static void run_step(ncclComm_t comm, const struct options *o, long step, struct buffers *b)
{
    int r = (int)o->rank, n = (int)o->nranks;

    report("ncclAllReduce", step,
           nccl.AllReduce(b->send, b->recv, 1024 * (size_t)(step + 1), ncclFloat32, ncclSum, comm, NULL));
    report("ncclBroadcast", step, nccl.Broadcast(b->send, b->recv, 256, ncclFloat16, 0, comm, NULL));
    report("ncclAllGather", step, nccl.AllGather(b->send, b->recv, 100, ncclFloat64, comm, NULL));
    report("ncclReduceScatter", step,
           nccl.ReduceScatter(b->send, b->recv, 64, ncclBfloat16, ncclMax, comm, NULL));
    report("ncclGroupStart", step, nccl.GroupStart());
    report("ncclSend", step, nccl.Send(b->send, 10, ncclInt32, (r + 1) % n, comm, NULL));
    report("ncclRecv", step, nccl.Recv(b->recv, 10, ncclInt32, (r - 1 + n) % n, comm, NULL));
    report("ncclGroupEnd", step, nccl.GroupEnd());
}

static void run_split(ncclComm_t comm, const struct options *o, struct buffers *b)
{
    ncclComm_t sub = NULL;
    int r = (int)o->rank;

    if (report("ncclCommSplit", -1, nccl.CommSplit(comm, r % 2, r, &sub, NULL)) != 0 || sub == NULL)
        return;
    report("ncclAllReduce", -1, nccl.AllReduce(b->send, b->recv, 4096, ncclFloat32, ncclSum, sub, NULL));
    report("ncclCommDestroy", -1, nccl.CommDestroy(sub));
}

/* Large enough for every call above: AllReduce 1024*steps floats, AllGather
 * and ReduceScatter nranks slots. */
static void alloc_buffers(const struct options *o, struct buffers *b)
{
    size_t bytes = 1024 * 4 * (size_t)(o->steps > 4 ? o->steps : 4);
    size_t gather = 100 * 8 * (size_t)o->nranks, scatter = 64 * 2 * (size_t)o->nranks;

    if (gather > bytes)
        bytes = gather;
    if (scatter > bytes)
        bytes = scatter;
    b->send = malloc(bytes);
    b->recv = malloc(bytes);
    if (b->send == NULL || b->recv == NULL)
        die("malloc");
    for (size_t i = 0; i < bytes; i++)
        b->send[i] = (char)(i * 31 + (size_t)o->rank);
    memset(b->recv, 0, bytes);
}

/* ---- setup ---- */

static void *must_sym(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL) {
        fprintf(stderr, "nccl_rank: dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return sym;
}

static void load(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "nccl_rank: dlopen(%s): %s\n", path, dlerror());
        exit(1);
    }
    *(void **)&nccl.GetUniqueId = must_sym(lib, "ncclGetUniqueId");
    *(void **)&nccl.CommInitRank = must_sym(lib, "ncclCommInitRank");
    *(void **)&nccl.CommSplit = must_sym(lib, "ncclCommSplit");
    *(void **)&nccl.CommDestroy = must_sym(lib, "ncclCommDestroy");
    *(void **)&nccl.AllReduce = must_sym(lib, "ncclAllReduce");
    *(void **)&nccl.Broadcast = must_sym(lib, "ncclBroadcast");
    *(void **)&nccl.AllGather = must_sym(lib, "ncclAllGather");
    *(void **)&nccl.ReduceScatter = must_sym(lib, "ncclReduceScatter");
    *(void **)&nccl.Send = must_sym(lib, "ncclSend");
    *(void **)&nccl.Recv = must_sym(lib, "ncclRecv");
    *(void **)&nccl.GroupStart = must_sym(lib, "ncclGroupStart");
    *(void **)&nccl.GroupEnd = must_sym(lib, "ncclGroupEnd");
}

static long parse_long(const char *flag, const char *value)
{
    char *end;
    long v;
    if (value == NULL) {
        fprintf(stderr, "nccl_rank: %s needs a value\n", flag);
        exit(1);
    }
    errno = 0;
    v = strtol(value, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) {
        fprintf(stderr, "nccl_rank: %s: bad value '%s'\n", flag, value);
        exit(1);
    }
    return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof(*o));
    o->rank = o->nranks = -1;
    o->steps = 1;
    if (argc < 2 || argv[1][0] == '-')
        goto usage;
    o->lib = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--rank") == 0) o->rank = parse_long(a, v), i++;
        else if (strcmp(a, "--nranks") == 0) o->nranks = parse_long(a, v), i++;
        else if (strcmp(a, "--steps") == 0) o->steps = parse_long(a, v), i++;
        else if (strcmp(a, "--delay-us") == 0) o->delay_us = parse_long(a, v), i++;
        else if (strcmp(a, "--id-file") == 0 && v != NULL) o->id_file = v, i++;
        else if (strcmp(a, "--create-id") == 0) o->create_id = 1;
        else if (strcmp(a, "--wait-stdin") == 0) o->wait_stdin = 1;
        else if (strcmp(a, "--split") == 0) o->split = 1;
        else goto usage;
    }
    if (o->nranks >= 1 && o->nranks <= 1 << 20 && o->rank >= 0 && o->rank < o->nranks && o->id_file != NULL)
        return;
usage:
    fprintf(stderr, "usage: nccl_rank LIBNCCL --rank R --nranks N --id-file PATH [--create-id]"
                    " [--steps S] [--wait-stdin] [--delay-us D] [--split]\n");
    exit(1);
}

int main(int argc, char **argv)
{
    struct options o;
    struct buffers b;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t rc;

    setvbuf(stdout, NULL, _IOLBF, 0);
    parse_args(argc, argv, &o);
    if (o.delay_us > 0) {
        char v[32];
        snprintf(v, sizeof(v), "%ld", o.delay_us);
        setenv("STAND_IN_NCCL_DELAY_US", v, 1);
    }
    load(o.lib);
    if (o.wait_stdin) {
        char line[64];
        printf("ready pid=%d\n", (int)getpid());
        if (fgets(line, sizeof(line), stdin) == NULL)
            return 1;
    }
    memset(&id, 0, sizeof(id));
    if (o.create_id) {
        if (report("ncclGetUniqueId", -1, nccl.GetUniqueId(&id)) != 0)
            return 1;
        write_id(o.id_file, &id);
    } else {
        read_id(o.id_file, &id);
    }
    rc = nccl.CommInitRank(&comm, (int)o.nranks, id, (int)o.rank);
    printf("ncclCommInitRank rc=%d\n", rc);
    if (rc != 0)
        return 2;

    alloc_buffers(&o, &b);
    for (long step = 0; step < o.steps; step++)
        run_step(comm, &o, step, &b);
    if (o.split)
        run_split(comm, &o, &b);
    report("ncclCommDestroy", -1, nccl.CommDestroy(comm));
    free(b.send);
    free(b.recv);
    return failed ? 3 : 0;
}
