#ifndef OE_TORCH_STEPS_H
#define OE_TORCH_STEPS_H
/* The step rule of torch.bpf.c, free of BPF helpers and maps, so tests/unit compiles it with gcc
 * and drives it (tests/unit/receivers/test_torch_step_rule.py). Needs u8/u32/u64, torch.h and
 * TORCH_STEP_GAP_NS, TORCH_STEP_MAX_NS, TORCH_STEP_MAX_OPS. Times are ns of one clock.
 *
 * A step is the top-level operator calls of one thread (outside traced Python calls) between
 * two boundaries. A top-level call entering at `now` ends the open step first when
 * - the thread has shown no step marker and the step's last call returned more than
 *   TORCH_STEP_GAP_NS before (gap), or
 * - the step has been open more than TORCH_STEP_MAX_NS (max_duration), or
 * - the step holds TORCH_STEP_MAX_OPS calls (max_ops);
 * markers (torch.bpf.c) end it at once. */

struct torch_step_state {
    u64 start;   /* entry of the open step's first call; 0: none open */
    u64 last;    /* return of the open step's last call (its first call's entry until then) */
    u64 seq;     /* steps begun on this thread */
    u32 ops;     /* calls in the open step */
    u32 marked;  /* a step marker was seen on this thread: no gap rule */
};

/* TORCH_STEP_END_* that ends the open step before a top-level call entering at `now`; 0: none
 * (or no step open). */
static __always_inline u8 torch_step_due(const struct torch_step_state *st, u64 now)
{
    if (!st->start)
        return 0;
    if (!st->marked && now - st->last > TORCH_STEP_GAP_NS)
        return TORCH_STEP_END_GAP;
    if (now - st->start > TORCH_STEP_MAX_NS)
        return TORCH_STEP_END_MAX_DURATION;
    if (st->ops >= TORCH_STEP_MAX_OPS)
        return TORCH_STEP_END_MAX_OPS;
    return 0;
}

/* A top-level call enters at `now` (after the open step, if due, was ended: start = 0): it joins
 * the open step or begins one. */
static __always_inline void torch_step_add(struct torch_step_state *st, u64 now)
{
    if (!st->start) {
        st->start = now;
        st->last = now;
        st->ops = 0;
        st->seq += 1;
    }
    st->ops += 1;
}

#endif /* OE_TORCH_STEPS_H */
