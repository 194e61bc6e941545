/* Shared part of every otel-ebpf BPF program. otel_ebpf.bpf.receiver prepends it to each receiver's
 * <name>.bpf.c before compiling: BCC rewrites tracepoint arguments and map calls only in the
 * main source text (not in #included files, not inside macros).
 *
 * - which processes are traced: OE_FILTER_PIDS=1 keeps a set of thread-group ids, seeded from
 *   Python with the target PIDs and followed through fork() in the kernel (task_newtask), so
 *   children that live a few milliseconds are traced from their first instruction;
 *   OE_FILTER_PIDS=0 traces every process that maps a probed library.
 * - one ring buffer per program ("events"), and a drop counter array ("drops").
 * - process exec (to read /proc identity while the process lives) and exit (group leader).
 * - watching a traced process open a library whose basename starts with OE_LIB_PATTERN
 *   (matched at sys_enter_openat, reported at sys_exit_openat when the open succeeded), so Python can attach uprobes before the library is mapped. With
 *   OE_PAUSE_ON_LOAD=1 the process is stopped (SIGSTOP) until Python attached and sent SIGCONT,
 *   so not even its first call into the library is missed. A stop is made only while the pause
 *   guard's leases are current (oe_may_pause), and the guard's supervisor resumes any stop older
 *   than pause_timeout. Each stopped process is recorded in oe_paused (pinned on bpffs by
 *   otel_ebpf/bpf/paused.py), so the supervisor, or an agent started after this one and its
 *   supervisor were both killed, resumes exactly the processes left stopped.
 *
 * Only tracepoint arguments and helpers are used, never task_struct fields: the kernel headers
 * BCC compiles against may be older than the running kernel (e.g. Debian 6.1 headers on 6.18),
 * and their struct layouts would be wrong.
 *
 * Every event struct starts with a u8 type; receivers use types >= 16.
 *
 * - with OE_THREAD_CTX=1 (cuda, python, torch): the per-thread "current call" map
 *   oe_thread_ctx, see below.
 */
#include <uapi/linux/ptrace.h>

#ifndef OE_FILTER_PIDS
#define OE_FILTER_PIDS 1
#endif
#ifndef OE_MAX_PIDS
#define OE_MAX_PIDS 16384
#endif
#ifndef OE_RINGBUF_PAGES
#define OE_RINGBUF_PAGES 256
#endif
#ifndef OE_PAUSE_ON_LOAD
#define OE_PAUSE_ON_LOAD 0
#endif
#ifndef OE_AGENT_TGID
#define OE_AGENT_TGID 0 /* the agent's own process: never stopped by its own programs */
#endif
#ifndef OE_WAKEUP_EVERY
#define OE_WAKEUP_EVERY 64
#endif
#define OE_PATH_MAX 256

#define OE_EV_PROC_EXIT 1
#define OE_EV_LIB_OPEN 2
#define OE_EV_EXEC 3

/* drops[] indexes, mirrored in otel_ebpf/bpf/receiver.py DROP_REASONS */
#define OE_DROP_RINGBUF 0
#define OE_DROP_PIDMAP 1
#define OE_DROP_STATEMAP 2
#define OE_DROP_STATSMAP 3
#define OE_DROP_LIFECYCLE 4
#define OE_DROP_CTXMAP 5
#define OE_DROP_PAUSEDMAP 6
#define OE_DROP_SLOTS 7

struct oe_proc_exit {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u64 ts;
    char comm[16];
};

struct oe_lib_open {
    u8 type;
    u8 paused;
    u8 _pad[2];
    u32 pid;
    u32 tid;
    u32 _pad2;
    u64 ts;
    char path[OE_PATH_MAX];
};

BPF_RINGBUF_OUTPUT(events, OE_RINGBUF_PAGES);
/* Process lifecycle (exec, exit, library open) has its own small ring buffer, so a flood of
 * call records can never push out the record that frees a process's state or un-pauses it. */
#ifndef OE_LIFECYCLE_PAGES
#define OE_LIFECYCLE_PAGES 16
#endif
BPF_RINGBUF_OUTPUT(lifecycle, OE_LIFECYCLE_PAGES);
BPF_HASH(traced, u32, u8, OE_MAX_PIDS);
#if OE_PAUSE_ON_LOAD && defined(OE_LIB_PATTERN)
/* processes the agent started while this program is loaded (followed through fork from
 * OE_AGENT_TGID): never stopped by it. A full map leaves a helper stoppable, bounded by the
 * pause guard like any process. */
BPF_HASH(oe_exempt, u32, u8, 1024);
#endif
BPF_ARRAY(drops, u64, OE_DROP_SLOTS);

static __always_inline void oe_drop(int idx)
{
    u64 *v = drops.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* Ring-buffer wakeups cost about as much as the probe itself when the consumer keeps up
 * (the default "adaptive" mode then wakes it for every record). Records are submitted with
 * BPF_RB_NO_WAKEUP and every OE_WAKEUP_EVERY-th record per CPU forces one; Python also drains
 * the buffer after each poll timeout, so no record waits longer than one poll interval. */
BPF_PERCPU_ARRAY(oe_wake, u64, 1);

static __always_inline u64 oe_wakeup_flags(void)
{
    int zero = 0;
    u64 *n = oe_wake.lookup(&zero);
    if (!n)
        return 0;
    *n += 1;
    return (*n % OE_WAKEUP_EVERY) ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP;
}

static __always_inline int oe_is_traced(u32 tgid)
{
#if OE_FILTER_PIDS
    return traced.lookup(&tgid) != NULL;
#else
    return 1;
#endif
}

/* Records are reserved in the ring buffer, zeroed (the verifier rejects reads of padding),
 * and a full buffer is counted in drops[OE_DROP_RINGBUF]. Map calls cannot sit in macros. */

#if OE_FILTER_PIDS || (OE_PAUSE_ON_LOAD && defined(OE_LIB_PATTERN))
TRACEPOINT_PROBE(task, task_newtask)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (args->clone_flags & 0x00010000 /* CLONE_THREAD: same process */)
        return 0;
    u32 child = args->pid;
    u8 one = 1;
#if OE_PAUSE_ON_LOAD && defined(OE_LIB_PATTERN)
    /* what the agent starts while its programs are loaded (helpers, the uprobe releaser) is
     * never stopped by them; the command of `run --` is forked before they load */
    if (parent == OE_AGENT_TGID || oe_exempt.lookup(&parent))
        oe_exempt.update(&child, &one);
#endif
#if OE_FILTER_PIDS
    if (!traced.lookup(&parent))
        return 0;
    if (traced.update(&child, &one) != 0)
        oe_drop(OE_DROP_PIDMAP);
#endif
    return 0;
}
#endif

/* A traced process became a new program: Python reads its /proc identity at once (forced
 * wakeup), while it is alive; short-lived processes would otherwise be gone by the time their
 * first spans are exported. Same layout as oe_proc_exit. */
TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(tgid))
        return 0;
    struct oe_proc_exit *e = lifecycle.ringbuf_reserve(sizeof(struct oe_proc_exit));
    if (!e) {
        oe_drop(OE_DROP_LIFECYCLE);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = OE_EV_EXEC;
    e->pid = tgid;
    e->ts = bpf_ktime_get_ns();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    lifecycle.ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id != tgid)
        return 0; /* a thread, not the process */
#if OE_PAUSE_ON_LOAD && defined(OE_LIB_PATTERN)
    oe_exempt.delete(&tgid);
#endif
    if (!oe_is_traced(tgid))
        return 0;
#if OE_FILTER_PIDS
    traced.delete(&tgid);
#endif
    struct oe_proc_exit *e = lifecycle.ringbuf_reserve(sizeof(struct oe_proc_exit));
    if (!e) {
        oe_drop(OE_DROP_LIFECYCLE);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = OE_EV_PROC_EXIT;
    e->pid = tgid;
    e->ts = bpf_ktime_get_ns();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    lifecycle.ringbuf_submit(e, 0);
    return 0;
}

#ifdef OE_LIB_PATTERN
/* basename(path) starts with OE_LIB_PATTERN ("libcudart.so", "libnccl.so").
 * The scan for the last '/' is a bounded loop, not unrolled: unrolled, its 255 steps cost ~0.45 s of
 * compile (LLVM and the verifier) in every program that watches a library, at every agent start. The
 * basename offset lives on the stack (volatile), not in a register: the verifier then reads it back as
 * an unknown scalar, so the states of successive iterations match and are pruned; kept in a register its
 * exact value differs in every iteration and every path, and the walk exceeded the verifier's 1M-
 * instruction budget (E2BIG). The pattern's own loop is short and stays unrolled. */
/* One pattern at basename offset b; the pattern's length is a constant, so the loop unrolls. */
#define OE_PREFIX_AT(path, b, PAT, matched)                                  \
    do {                                                                     \
        const char pat_[] = PAT;                                             \
        matched = 1;                                                         \
        _Pragma("unroll")                                                    \
        for (int j_ = 0; j_ < (int)sizeof(pat_) - 1; j_++) {                 \
            if (path[(b + j_) & (OE_PATH_MAX - 1)] != pat_[j_]) {            \
                matched = 0;                                                 \
                break;                                                       \
            }                                                                \
        }                                                                    \
    } while (0)

/* OE_LIB_PATTERN2..4: more prefixes, any of which matches (the library gate of a deferred start,
 * otel_ebpf/bpf/gate.py, watches the libraries of every receiver still compiling). Returns the
 * number of the pattern that matched (1-4), 0 for none. */
static __always_inline int oe_lib_match(const char *path)
{
    volatile int base = 0;
    for (int i = 0; i < OE_PATH_MAX - 1; i++) {
        char c = path[i];
        if (c == 0)
            break;
        if (c == '/')
            base = i + 1;
    }
    int b = base;
    int m = 0;
    OE_PREFIX_AT(path, b, OE_LIB_PATTERN, m);
    if (m)
        return 1;
#ifdef OE_LIB_PATTERN2
    OE_PREFIX_AT(path, b, OE_LIB_PATTERN2, m);
    if (m)
        return 2;
#endif
#ifdef OE_LIB_PATTERN3
    OE_PREFIX_AT(path, b, OE_LIB_PATTERN3, m);
    if (m)
        return 3;
#endif
#ifdef OE_LIB_PATTERN4
    OE_PREFIX_AT(path, b, OE_LIB_PATTERN4, m);
    if (m)
        return 4;
#endif
    return 0;
}

#ifdef OE_GATE
/* The gate's patterns whose receiver is ready (index: pattern number - 1): no longer watched,
 * the receiver's own program watches its library from then on. */
BPF_ARRAY(oe_gate_open, u8, 4);

static __always_inline int oe_gate_match(const char *path)
{
    int m = oe_lib_match(path);
    if (!m)
        return 0;
    int i = m - 1;
    u8 *open = oe_gate_open.lookup(&i);
    return open && *open ? 0 : m;
}
#define OE_MATCH oe_gate_match
#else
#define OE_MATCH oe_lib_match
#endif

struct oe_path_buf {
    char path[OE_PATH_MAX];
};
/* Scratch space: the path is read and matched here, and a ring-buffer record is reserved only
 * for a match (reserving first would cost a record, and a counted drop when the buffer is
 * full, for every openat of a traced process). */
BPF_PERCPU_ARRAY(oe_path_scratch, struct oe_path_buf, 1);

#if OE_PAUSE_ON_LOAD
/* Processes this program stopped and the agent has not resumed yet (key: tgid). Python deletes
 * an entry after its SIGCONT; OE_PAUSED_PIN pins the map on bpffs so the entries outlive a
 * SIGKILLed agent (otel_ebpf/bpf/paused.py reads them; its VALUE mirrors this struct). boot_ns is
 * CLOCK_BOOTTIME at the stop, comparable with /proc/PID/stat's start time: a process that
 * started later is not the one stopped (pid reuse). ts is the library-open record's ts. */
/* Key: the stop itself (tgid and the library-open record's ts), so every delete names exactly
 * one stop: with a key of the tgid alone, the agent's lookup-then-delete of stop k raced with the
 * same process's next stop (an exec'ing process stops again within a millisecond of SIGCONT) and
 * deleted the record of stop k+1, which no one then resumed. */
struct oe_paused_key {
    u32 tgid;
    u32 _pad;
    u64 ts;
};
struct oe_paused {
    u64 boot_ns;
    u64 ts;
};
#ifdef OE_PAUSED_PIN
BPF_TABLE_PINNED("hash", struct oe_paused_key, struct oe_paused, oe_paused, OE_MAX_PIDS, OE_PAUSED_PIN);
#else
BPF_HASH(oe_paused, struct oe_paused_key, struct oe_paused, OE_MAX_PIDS);
#endif

/* The pause guard (otel_ebpf/bpf/pauseguard.py): a process is stopped only while two leases are
 * current, so no state of the agent can hold one for long:
 *   slot 0            the supervisor's: a separate process that resumes every stop older than
 *                     pause_timeout, renewed every tick (a stopped, starved or killed supervisor
 *                     stops the pauses within one lease);
 *   slot OE_GUARD_SLOT this program's poll loop's: the thread that attaches and resumes,
 *                     renewed every poll round (a stopped, hung or dying agent stops the pauses).
 * Values are bpf_ktime_get_ns() deadlines (CLOCK_MONOTONIC). Without OE_PAUSE_GUARD_PIN the
 * array is private and never written: nothing is ever stopped. The agent's own process
 * (OE_AGENT_TGID: BCC opens the library to attach, which would stop the agent itself when it
 * traces every process) and what it starts while loaded (oe_exempt) are never stopped. */
#define OE_GUARD_SLOTS 64
#ifndef OE_GUARD_SLOT
#define OE_GUARD_SLOT 1
#endif
#ifdef OE_PAUSE_GUARD_PIN
BPF_TABLE_PINNED("array", u32, u64, oe_pause_guard, OE_GUARD_SLOTS, OE_PAUSE_GUARD_PIN);
#else
BPF_ARRAY(oe_pause_guard, u64, OE_GUARD_SLOTS);
#endif
/* stops not made because a lease had run out: [0] the agent's poll loop, [1] the supervisor,
 * [2] the supervisor holds its lease at OE_LEASE_THROTTLED: the agent's cgroup is being
 * CPU-throttled, so nothing can promise a resume within pause_timeout */
BPF_ARRAY(oe_pause_skips, u64, 3);
#define OE_LEASE_THROTTLED 1

static __always_inline int oe_lease_current(u32 slot, u64 now)
{
    u64 *deadline = oe_pause_guard.lookup(&slot);
    return deadline && now < *deadline;
}

static __always_inline int oe_may_pause(u32 tgid)
{
    if (tgid == OE_AGENT_TGID || oe_exempt.lookup(&tgid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    int skip = -1;
    u32 guard = 0;
    u64 *lease = oe_pause_guard.lookup(&guard);
    if (lease && *lease == OE_LEASE_THROTTLED)
        skip = 2;
    else if (!lease || now >= *lease)
        skip = 1;
    else if (!oe_lease_current(OE_GUARD_SLOT, now))
        skip = 0;
    if (skip < 0)
        return 1;
    u64 *n = oe_pause_skips.lookup(&skip);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
#endif

/* An openat that matched, from its entry to its exit (key: thread id). Only a successful open is
 * reported and stopped for: the dynamic loader tries every RPATH/RUNPATH/LD_LIBRARY_PATH and
 * default-directory candidate, and on a host without a driver the real libcudart 12 looked for libcuda.so.1
 * in 30-40 places a process (strace; the 10,000-process storm test got ~30 records and stops a process
 * when the entry reported them).
 * At the exit the file is open and not yet mapped, so a stop there still comes before the library's
 * first instruction. LRU: an entry whose thread died inside openat (exit_group from another thread)
 * is pushed out, never left to fill the map; only that many threads in openat at once could push out
 * a live one. */
#define OE_OPEN_INFLIGHT 1024
BPF_TABLE("lru_hash", u32, struct oe_path_buf, oe_open_inflight, OE_OPEN_INFLIGHT);

TRACEPOINT_PROBE(syscalls, sys_enter_openat)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!oe_is_traced(tgid))
        return 0;
    int zero = 0;
    struct oe_path_buf *buf = oe_path_scratch.lookup(&zero);
    if (!buf)
        return 0;
    if (bpf_probe_read_user_str(buf->path, sizeof(buf->path), args->filename) <= 0 || !OE_MATCH(buf->path))
        return 0;
    u32 tid = (u32)id;
    oe_open_inflight.update(&tid, buf);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_openat)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!oe_is_traced(tgid))
        return 0;
    u32 tid = (u32)id;
    struct oe_path_buf *buf = oe_open_inflight.lookup(&tid);
    if (!buf)
        return 0;
    if (args->ret < 0) {
        oe_open_inflight.delete(&tid);
        return 0;
    }
    struct oe_lib_open *e = lifecycle.ringbuf_reserve(sizeof(struct oe_lib_open));
    if (!e) {
        oe_open_inflight.delete(&tid);
        oe_drop(OE_DROP_LIFECYCLE);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    __builtin_memcpy(e->path, buf->path, sizeof(e->path));
    oe_open_inflight.delete(&tid);
    e->type = OE_EV_LIB_OPEN;
    e->pid = tgid;
    e->tid = tid;
    e->ts = bpf_ktime_get_ns();
#if OE_PAUSE_ON_LOAD
    /* Recorded before the stop: a stop that could not be recorded is not made (a full map,
     * counted in drops[OE_DROP_PAUSEDMAP]): nothing could resume it if the agent died. Without
     * current leases (oe_may_pause) the process is not stopped; probes attach while it runs. */
    if (oe_may_pause(tgid)) {
        struct oe_paused_key k = {};
        k.tgid = tgid;
        k.ts = e->ts;
        struct oe_paused p = {};
        p.boot_ns = bpf_ktime_get_boot_ns();
        p.ts = e->ts;
        if (oe_paused.update(&k, &p) != 0)
            oe_drop(OE_DROP_PAUSEDMAP);
        else if (bpf_send_signal(19 /* SIGSTOP */) == 0)
            e->paused = 1;
        else /* -EBUSY: the CPU's deferred-signal slot is taken (kernel/trace/bpf_trace.c) */
            oe_paused.delete(&k);
    }
#endif
    lifecycle.ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* at once: the process may be paused */
    return 0;
}
#endif /* OE_LIB_PATTERN */


#ifdef OE_THREAD_CTX
/* ---- per-thread current call, shared by the programs of one agent -------------------------
 * The python and torch programs write the innermost open call of the thread (one slot each:
 * they keep separate stacks) at entry and return; the cuda program reads it at each call's
 * entry, so a CUDA span can name the Python function / PyTorch operator that issued it.
 * Shared between separately compiled programs through a pinned map: OE_THREAD_CTX_PIN is its
 * bpffs path (otel_ebpf/bpf/threadctx.py; the first program creates it, the others open it).
 * Without it (bpffs unavailable) the map is private to each program: nothing is shared.
 * Key: thread id. Only the thread itself writes or reads its call slots (from its own probes);
 * `capture` is written by the cuda program (a capture may end on another thread than the one
 * that began it) and read by the cuda and nccl programs: a call made while it is non-zero is
 * recorded into a CUDA graph, not run. Entries go at thread exit (oe_ctx_forget) or with the map. The size is fixed, not a
 * parameter: every program opening the pinned map must declare it the same. */
#define OE_CTX_PYTHON 1
#define OE_CTX_TORCH 2
#define OE_CTX_MAX_THREADS 65536

struct oe_ctx_frame {
    u64 start;   /* start_ns of the innermost open call of this kind; 0: none open */
    u64 root;    /* start_ns of the outermost open call of this kind */
    u64 id;      /* torch: the operator's entry address (its uprobe's ip); python: 0 */
    u32 depth;
    u32 _pad;
};

struct oe_thread_ctx {
    struct oe_ctx_frame k[2]; /* [OE_CTX_PYTHON - 1], [OE_CTX_TORCH - 1] */
    u32 capture;              /* CUDA stream captures this thread began and has not ended (cuda.bpf.c) */
    u32 _pad;
};

#ifdef OE_THREAD_CTX_PIN
BPF_TABLE_PINNED("hash", u32, struct oe_thread_ctx, oe_thread_ctx, OE_CTX_MAX_THREADS, OE_THREAD_CTX_PIN);
#else
BPF_HASH(oe_thread_ctx, u32, struct oe_thread_ctx, OE_CTX_MAX_THREADS);
#endif

/* Set the `kind` slot of thread `tid` (start 0: no call of that kind open). A full map is
 * counted in drops[OE_DROP_CTXMAP]; that thread's CUDA calls then name no enclosing call. */
static __always_inline void oe_ctx_set(u32 tid, u32 kind, u64 start, u64 root, u64 id, u32 depth)
{
    struct oe_thread_ctx *c = oe_thread_ctx.lookup(&tid);
    if (!c) {
        if (!start)
            return;
        struct oe_thread_ctx zero = {};
        if (oe_thread_ctx.insert(&tid, &zero) != 0) {
            oe_drop(OE_DROP_CTXMAP);
            return;
        }
        c = oe_thread_ctx.lookup(&tid);
        if (!c)
            return;
    }
    struct oe_ctx_frame *f = &c->k[(kind - 1) & 1];
    f->start = start;
    f->root = root;
    f->id = id;
    f->depth = depth;
}

/* The innermost open call of thread `tid` over both kinds (the later start): its kind
 * (OE_CTX_*), or 0 when none is open. */
static __always_inline u32 oe_ctx_get(u32 tid, u64 *start, u64 *root, u64 *id)
{
    struct oe_thread_ctx *c = oe_thread_ctx.lookup(&tid);
    if (!c)
        return 0;
    u64 py = c->k[0].start, op = c->k[1].start;
    if (op && op >= py) {
        *start = op;
        *root = c->k[1].root;
        *id = c->k[1].id;
        return OE_CTX_TORCH;
    }
    if (py) {
        *start = py;
        *root = c->k[0].root;
        *id = c->k[0].id;
        return OE_CTX_PYTHON;
    }
    return 0;
}

/* Stream captures open on thread `tid` (0: none, or not known). */
static __always_inline u32 oe_capture_depth(u32 tid)
{
    struct oe_thread_ctx *c = oe_thread_ctx.lookup(&tid);
    return c ? c->capture : 0;
}

/* One capture more (delta 1) or less (-1) on thread `tid`; a full map is counted in drops[OE_DROP_CTXMAP]
 * (that thread's captured work then reads as run). Returns 1 when the count changed. */
static __always_inline int oe_capture_add(u32 tid, s32 delta)
{
    struct oe_thread_ctx *c = oe_thread_ctx.lookup(&tid);
    if (!c) {
        if (delta <= 0)
            return 0;
        struct oe_thread_ctx zero = {};
        if (oe_thread_ctx.insert(&tid, &zero) != 0 || !(c = oe_thread_ctx.lookup(&tid))) {
            oe_drop(OE_DROP_CTXMAP);
            return 0;
        }
    }
    if (delta < 0 && c->capture == 0)
        return 0;
    __sync_fetch_and_add(&c->capture, (u32)delta);
    return 1;
}

static __always_inline void oe_ctx_forget(u32 tid)
{
    oe_thread_ctx.delete(&tid);
}
#endif /* OE_THREAD_CTX */
