/* otel_ebpf.processors.collective_join._intake: the collective join's common case taken in C (intake.py).
 *
 * At 1,024 ranks all but the first and the last rank span of a collective only join it: the Python path
 * (processor.py CollectiveJoin._span -> _ranked -> _add, Collective.add, Store.advance) checks the span's shape,
 * finds the pending collective, compares the span's op/count/datatype with the first rank's, keeps the span and its
 * start and moves the rank's wavefront on; the join's thread took a third of the gateway's CPU through gRPC (~5 of
 * ~15 us a rank span: docs/benchmarks.md, session 27). Intake(span_type, collective_type, front_type, store, named,
 * max_ranks).take(events, start) does the same for events[start], events[start + 1], ... while each is such a span,
 * and returns the index of the first that is not: the caller hands that one to the Python path and calls take again
 * after it, so every event is processed in its order by one path or the other.
 *
 * Taken here, only a span for which the Python path would do exactly that and nothing else:
 *   - an exact ``span_type`` (the SDK's ReadableSpan) whose ``_attributes`` is an exact dict with exact-int
 *     ``nccl.rank``/``nccl.nranks``, 0 <= rank < nranks <= max_ranks, an exact-str ``nccl.comm.id``, an exact-int
 *     ``nccl.seq``, a ``_name`` (exact str) not in ``named``, a false ``nccl.captured`` if any, a ``nccl.timing`` other
 *     than "gpu", no ``nccl.peer`` (CollectiveJoin._span's one test);
 *   - of a collective pending in ``store._pending`` (an exact ``collective_type``) that holds at least one rank span
 *     and not yet this rank, has the same nranks and the same (op, count, datatype) (``sig``), and which this span
 *     does not complete (the release is Python's);
 *   - while the store holds fewer than ``store.max_spans`` rank spans (no eviction to make);
 *   - with a wavefront entry for (comm, rank) already (``store._fronts``: adding one has bounds to keep);
 *   - with ``_start_time``/``_end_time`` exact ints or None (0, as core.readable.span_times reads them).
 * What it does then is Collective.add (arrivals, ``ranks[rank]``, ``starts[rank]``), ``store.spans += 1``, and
 * Store.advance's update of an existing entry (seq and resource when the seq is higher). Nothing is changed for a span
 * it does not take. Single-threaded like the join: it runs under the GIL and calls no Python code but the comparisons
 * of attribute values (str, int, float, bool, tuple). tests/unit/processors/test_collective_join_intake.py runs the
 * join's scenarios with and without it and compares everything that leaves.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include "../../core/_slots.h"

typedef struct {
    PyObject_HEAD
    PyTypeObject *span_type, *coll_type, *front_type;
    PyObject *store, *named;
    long max_ranks;
    Py_ssize_t o_ranks, o_starts, o_nranks, o_sig, o_first_start, o_last, o_last_rank, o_end; /* Collective slots */
    Py_ssize_t o_seqs, o_resources;                                                            /* Front slots */
} Intake;

static PyObject *s_attributes, *s_name, *s_start, *s_end, *s_resource, *s_pending, *s_fronts, *s_spans,
    *s_max_spans, *k_rank, *k_nranks, *k_comm, *k_seq, *k_captured, *k_timing, *k_peer, *k_sig[3], *s_gpu, *zero;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* ``*out`` from exact int ``v``; 0 when ``v`` is not one or does not fit. */
static int as_ll(PyObject *v, long long *out)
{
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

static void set_slot(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(obj, off);
    Py_INCREF(v);
    SLOT(obj, off) = v;
    Py_XDECREF(old);
}

/* ``span``'s time field ``name`` (new reference), 0 for None; NULL (no error set) when it is neither an int nor
 * None. */
static PyObject *span_time(PyObject *span, PyObject *name, long long *value)
{
    PyObject *v = PyObject_GetAttr(span, name);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (v == Py_None) {
        Py_DECREF(v);
        v = Py_NewRef(zero);
    }
    if (!as_ll(v, value)) {
        PyErr_Clear();
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

typedef struct {
    PyObject *comm;      /* borrowed: the last span's comm id, while ``entry`` is its collective */
    long long seq;
    PyObject *entry;     /* strong */
} Cache;

/* The collective of (comm, seq) in ``pending`` (borrowed, or a cached strong one); NULL (no error) when none. */
static PyObject *collective(Intake *self, PyObject *pending, PyObject *comm, PyObject *seq_o, long long seq,
                            Cache *cache)
{
    if (cache->entry != NULL && cache->seq == seq
        && (cache->comm == comm || PyUnicode_Compare(cache->comm, comm) == 0))
        return cache->entry;
    PyObject *key = PyTuple_Pack(2, comm, seq_o);
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(pending, key);
    Py_DECREF(key);
    if (entry == NULL || !Py_IS_TYPE(entry, self->coll_type))
        return NULL;
    Py_XSETREF(cache->entry, Py_NewRef(entry));
    cache->comm = comm;
    cache->seq = seq;
    return entry;
}

/* 1: ``ev`` taken (see the module doc); 0: not taken, nothing changed. Never leaves an error set. */
static int take_one(Intake *self, PyObject *ev, PyObject *pending, PyObject *fronts, Py_ssize_t *spans,
                    Py_ssize_t max_spans, Cache *cache)
{
    if (!Py_IS_TYPE(ev, self->span_type) || *spans >= max_spans)
        return 0;
    int taken = 0;
    PyObject *attrs = PyObject_GetAttr(ev, s_attributes), *name = NULL, *s_o = NULL, *e_o = NULL, *res = NULL;
    if (attrs == NULL || !PyDict_CheckExact(attrs))
        goto done;
    PyObject *rank_o = PyDict_GetItemWithError(attrs, k_rank), *nranks_o = PyDict_GetItemWithError(attrs, k_nranks);
    PyObject *comm = PyDict_GetItemWithError(attrs, k_comm), *seq_o = PyDict_GetItemWithError(attrs, k_seq);
    long long rank, nranks, seq;
    if (!as_ll(rank_o, &rank) || !as_ll(nranks_o, &nranks) || !(0 <= rank && rank < nranks && nranks <= self->max_ranks)
        || comm == NULL || !PyUnicode_CheckExact(comm) || !as_ll(seq_o, &seq))
        goto done;
    name = PyObject_GetAttr(ev, s_name);
    if (name == NULL || !PyUnicode_CheckExact(name) || PySet_Contains(self->named, name) != 0)
        goto done;
    PyObject *v = PyDict_GetItemWithError(attrs, k_captured);
    if (v != NULL && PyObject_IsTrue(v) != 0)
        goto done;
    if ((v = PyDict_GetItemWithError(attrs, k_timing)) != NULL && PyObject_RichCompareBool(v, s_gpu, Py_EQ) != 0)
        goto done;
    if (PyDict_Contains(attrs, k_peer) != 0)
        goto done;
    PyObject *entry = collective(self, pending, comm, seq_o, seq, cache);
    if (entry == NULL)
        goto done;
    PyObject *ranks = SLOT(entry, self->o_ranks), *starts = SLOT(entry, self->o_starts);
    PyObject *sig = SLOT(entry, self->o_sig);
    long long e_nranks, first_start, last, last_rank, end;
    if (ranks == NULL || !PyDict_CheckExact(ranks) || starts == NULL || !PyDict_CheckExact(starts)
        || !as_ll(SLOT(entry, self->o_nranks), &e_nranks) || e_nranks != nranks
        || PyDict_GET_SIZE(ranks) == 0 || PyDict_GET_SIZE(ranks) + 1 >= e_nranks
        || PyDict_Contains(ranks, rank_o) != 0 || sig == NULL || !PyTuple_CheckExact(sig) || PyTuple_GET_SIZE(sig) != 3
        || !as_ll(SLOT(entry, self->o_first_start), &first_start) || !as_ll(SLOT(entry, self->o_last), &last)
        || !as_ll(SLOT(entry, self->o_last_rank), &last_rank) || !as_ll(SLOT(entry, self->o_end), &end))
        goto done;
    for (int j = 0; j < 3; j++) {
        PyObject *mine = PyDict_GetItemWithError(attrs, k_sig[j]);
        if (mine == NULL && PyErr_Occurred())
            goto done;
        if (PyObject_RichCompareBool(mine ? mine : Py_None, PyTuple_GET_ITEM(sig, j), Py_EQ) != 1)
            goto done;
    }
    PyObject *front = PyDict_GetItemWithError(fronts, comm);
    if (front == NULL || !Py_IS_TYPE(front, self->front_type))
        goto done;
    PyObject *seqs = SLOT(front, self->o_seqs), *resources = SLOT(front, self->o_resources), *old;
    if (seqs == NULL || !PyDict_CheckExact(seqs) || resources == NULL || !PyDict_CheckExact(resources)
        || (old = PyDict_GetItemWithError(seqs, rank_o)) == NULL)
        goto done;
    int behind = PyObject_RichCompareBool(old, seq_o, Py_LT); /* Store.advance: kept only when higher than before */
    long long s, e;
    if (behind < 0 || (s_o = span_time(ev, s_start, &s)) == NULL || (e_o = span_time(ev, s_end, &e)) == NULL)
        goto done;
    if (behind && (res = PyObject_GetAttr(ev, s_resource)) == NULL)
        goto done;
    /* Every check passed: the Python path's changes (Collective.add, then Store.advance). A store into a dict fails
     * only out of memory: before the span is held, it is undone and the span left to the Python path; after, the
     * wavefront is left as far as it got, as the Python path's would be (which would also pass the span on). */
    if (PyDict_SetItem(starts, rank_o, s_o) < 0)
        goto done;
    if (PyDict_SetItem(ranks, rank_o, ev) < 0) {
        PyErr_Clear();
        if (PyDict_DelItem(starts, rank_o) < 0) /* cannot fail for a key just stored */
            PyErr_Clear();
        goto done;
    }
    if (s < first_start)
        set_slot(entry, self->o_first_start, s_o);
    if (s > last || (s == last && rank > last_rank)) {
        set_slot(entry, self->o_last, s_o);
        set_slot(entry, self->o_last_rank, rank_o);
    }
    if (e > end)
        set_slot(entry, self->o_end, e_o);
    (*spans)++;
    taken = 1;
    if (behind && PyDict_SetItem(seqs, rank_o, seq_o) == 0) /* seq, then resource, as Store.advance stores them */
        (void)PyDict_SetItem(resources, rank_o, res);
done:
    PyErr_Clear(); /* a failed read only means "not this one": the Python path reads it again and decides */
    Py_XDECREF(attrs);
    Py_XDECREF(name);
    Py_XDECREF(s_o);
    Py_XDECREF(e_o);
    Py_XDECREF(res);
    return taken;
}

static PyObject *Intake_take(Intake *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take(events, start)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "take: events must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *pending = PyObject_GetAttr(self->store, s_pending), *fronts = PyObject_GetAttr(self->store, s_fronts);
    PyObject *spans_o = PyObject_GetAttr(self->store, s_spans), *max_o = PyObject_GetAttr(self->store, s_max_spans);
    PyObject *result = NULL;
    Cache cache = {NULL, 0, NULL};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = start < 0 ? 0 : start, spans, max_spans, held;
    if (pending == NULL || fronts == NULL || spans_o == NULL || max_o == NULL)
        goto done;
    if (!PyDict_Check(pending) || !PyDict_Check(fronts)) {
        PyErr_SetString(PyExc_TypeError, "take: the store's _pending and _fronts must be dicts");
        goto done;
    }
    if ((spans = PyLong_AsSsize_t(spans_o)) == -1 && PyErr_Occurred())
        goto done;
    if ((max_spans = PyLong_AsSsize_t(max_o)) == -1 && PyErr_Occurred())
        goto done;
    held = spans;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    while (i < n && take_one(self, items[i], pending, fronts, &spans, max_spans, &cache))
        i++;
    if (spans != held) {
        /* Once a span is taken, take returns its index and does not raise (the caller would hand the taken ones to
         * the Python path again): a count that cannot be stored (out of memory) leaves store.spans low by these. */
        PyObject *now = PyLong_FromSsize_t(spans);
        if (now == NULL || PyObject_SetAttr(self->store, s_spans, now) < 0)
            PyErr_Clear();
        Py_XDECREF(now);
    }
    result = PyLong_FromSsize_t(i);
done:
    Py_XDECREF(cache.entry);
    Py_XDECREF(pending);
    Py_XDECREF(fronts);
    Py_XDECREF(spans_o);
    Py_XDECREF(max_o);
    Py_DECREF(seq);
    return result;
}

static PyObject *Intake_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyTypeObject *span_type, *coll_type, *front_type;
    PyObject *store, *named;
    long max_ranks;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!l:Intake", &PyType_Type, &span_type, &PyType_Type, &coll_type, &PyType_Type,
                          &front_type, &store, &PyFrozenSet_Type, &named, &max_ranks))
        return NULL;
    Intake *self = (Intake *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->span_type = (PyTypeObject *)Py_NewRef(span_type);
    self->coll_type = (PyTypeObject *)Py_NewRef(coll_type);
    self->front_type = (PyTypeObject *)Py_NewRef(front_type);
    self->store = Py_NewRef(store);
    self->named = Py_NewRef(named);
    self->max_ranks = max_ranks;
    struct { Py_ssize_t *off; PyTypeObject *cls; const char *name; } slots[] = {
        {&self->o_ranks, coll_type, "ranks"}, {&self->o_starts, coll_type, "starts"},
        {&self->o_nranks, coll_type, "nranks"}, {&self->o_sig, coll_type, "sig"},
        {&self->o_first_start, coll_type, "first_start"}, {&self->o_last, coll_type, "last"},
        {&self->o_last_rank, coll_type, "last_rank"}, {&self->o_end, coll_type, "end"},
        {&self->o_seqs, front_type, "seqs"}, {&self->o_resources, front_type, "resources"},
    };
    for (size_t j = 0; j < sizeof slots / sizeof slots[0]; j++) {
        PyObject *name = PyUnicode_InternFromString(slots[j].name);
        *slots[j].off = name == NULL ? -1 : slot_offset(slots[j].cls, name);
        Py_XDECREF(name);
        if (*slots[j].off < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static void Intake_dealloc(Intake *self)
{
    Py_XDECREF(self->span_type);
    Py_XDECREF(self->coll_type);
    Py_XDECREF(self->front_type);
    Py_XDECREF(self->store);
    Py_XDECREF(self->named);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Intake_methods[] = {
    {"take", (PyCFunction)(void (*)(void))Intake_take, METH_FASTCALL,
     "take(events, start) -> the index of the first event from start on not taken (module doc)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IntakeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_ebpf.processors.collective_join._intake.Intake",
    .tp_basicsize = sizeof(Intake),
    .tp_dealloc = (destructor)Intake_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Intake(span_type, collective_type, front_type, store, named, max_ranks) (module doc).",
    .tp_methods = Intake_methods,
    .tp_new = Intake_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_ebpf.processors.collective_join._intake",
    "The collective join's common case taken in C (otel_ebpf/processors/collective_join/intake.py).", -1, NULL,
};

static int intern(PyObject **to, const char *s)
{
    return (*to = PyUnicode_InternFromString(s)) == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__intake(void)
{
    if (intern(&s_attributes, "_attributes") || intern(&s_name, "_name") || intern(&s_start, "_start_time")
        || intern(&s_end, "_end_time") || intern(&s_resource, "_resource") || intern(&s_pending, "_pending")
        || intern(&s_fronts, "_fronts") || intern(&s_spans, "spans") || intern(&s_max_spans, "max_spans")
        || intern(&k_rank, "nccl.rank") || intern(&k_nranks, "nccl.nranks") || intern(&k_comm, "nccl.comm.id")
        || intern(&k_seq, "nccl.seq") || intern(&k_captured, "nccl.captured") || intern(&k_timing, "nccl.timing")
        || intern(&k_peer, "nccl.peer") || intern(&k_sig[0], "nccl.op") || intern(&k_sig[1], "nccl.count")
        || intern(&k_sig[2], "nccl.datatype") || intern(&s_gpu, "gpu") || (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    if (PyType_Ready(&IntakeType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&IntakeType);
    if (PyModule_AddObject(m, "Intake", (PyObject *)&IntakeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
