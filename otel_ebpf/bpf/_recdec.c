/* otel_ebpf.bpf._recdec: ring-buffer records decoded in C into a receiver's typed events, a batch at a time.
 *
 * A receiver's Python ``decode`` unpacks a record with ``struct``, converts its kernel times, looks its symbol up
 * and calls the event class: ~3 us a record on the CUDA receiver's hot path (docs/benchmarks.md, issue 19). This
 * module does the same for the record types a receiver describes to it, and makes each event the way the frozen,
 * slotted dataclass's own ``__init__`` ends: the instance from its type's ``tp_alloc``, each field stored in its
 * slot (the member descriptor's offset: CPython 3.11 Objects/descrobject.c member_set -> PyMember_SetOne
 * T_OBJECT_EX), every slot filled. No Python code of the class runs, so a class must have nothing its ``__init__``
 * does besides the stores (otel_ebpf.bpf.records.decoder checks that: a fast_init dataclass, every field named).
 *
 * Decoder(cls, size, fields): ``fields`` a sequence of (slot, op, width, offset, arg, offset2, offset3), one per
 * slot of ``cls``; ``op``:
 *   OP_UINT / OP_SINT  the little-endian integer of ``width`` bytes (1, 2, 4, 8) at ``offset``
 *   OP_BOOL            True when that integer is not 0
 *   OP_EPOCH           the u64 at ``offset`` plus the ``offset_ns`` decode() is given (kernel -> epoch ns)
 *   OP_INDEX           ``arg[u]`` for the unsigned integer ``u`` at ``offset``; past the end: the record is
 *                      handed back (its Python decode counts it)
 *   OP_CONST           ``arg`` itself
 *   OP_CALL            None when the integer at ``offset`` is 0, else ``arg(u, epoch(u64 at offset2),
 *                      epoch(u64 at offset3))`` (the CUDA receiver's enclosing call: rare, a Python call)
 * Records(decoders: dict[int, Decoder]) keyed by the record's type byte. Records.decode(records, offset_ns,
 * seen) -> (items, handed_back, new_pids): ``items`` the records' events in order, a record of a type it has no
 * decoder for, shorter than its struct, or that a field could not be made of, left in its place as the bytes
 * object it was (``handed_back`` of them); ``new_pids`` the values of each event's ``pid`` slot (when the class
 * has one) not in ``seen`` (a dict's keys, a set: any container), each once. Thread-safe as far as its arguments are:
 * it holds the GIL throughout and keeps no state between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include "../core/_slots.h"
#include <stdint.h>
#include <string.h>

enum { OP_UINT = 1, OP_SINT, OP_BOOL, OP_EPOCH, OP_INDEX, OP_CONST, OP_CALL };

typedef struct {
    Py_ssize_t slot;   /* byte offset of the slot in the instance */
    int op, width;
    Py_ssize_t off, off2, off3;
    PyObject *arg;     /* OP_INDEX: a tuple; OP_CONST: the value; OP_CALL: a callable */
} field_t;

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    Py_ssize_t size;   /* the record struct's size: a shorter record is handed back */
    Py_ssize_t pid_slot; /* byte offset of the ``pid`` slot, or -1 */
    Py_ssize_t nfields;
    field_t *fields;
} Decoder;

static uint64_t rd_uint(const unsigned char *p, int width)
{
    switch (width) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

static int64_t rd_sint(const unsigned char *p, int width)
{
    switch (width) {
    case 1: return (int8_t)p[0];
    case 2: { int16_t v; memcpy(&v, p, 2); return v; }
    case 4: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

/* epoch ns = monotonic + offset, in Python's int arithmetic beyond 64 bits (as ``m + offset_ns`` is) */
static PyObject *epoch(uint64_t mono, long long offset_ns)
{
    if (mono <= (uint64_t)INT64_MAX) {
        int64_t m = (int64_t)mono, r;
        if (!__builtin_add_overflow(m, (int64_t)offset_ns, &r))
            return PyLong_FromLongLong(r);
    }
    PyObject *a = PyLong_FromUnsignedLongLong(mono), *b = PyLong_FromLongLong(offset_ns), *r = NULL;
    if (a != NULL && b != NULL)
        r = PyNumber_Add(a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return r;
}

/* The value of one field, a new reference; NULL with an exception set (or none: hand the record back). */
static PyObject *field_value(const field_t *f, const unsigned char *rec, long long offset_ns)
{
    switch (f->op) {
    case OP_UINT: return PyLong_FromUnsignedLongLong(rd_uint(rec + f->off, f->width));
    case OP_SINT: return PyLong_FromLongLong(rd_sint(rec + f->off, f->width));
    case OP_BOOL: return PyBool_FromLong(rd_uint(rec + f->off, f->width) != 0);
    case OP_EPOCH: return epoch(rd_uint(rec + f->off, 8), offset_ns);
    case OP_INDEX: {
        uint64_t i = rd_uint(rec + f->off, f->width);
        if (i >= (uint64_t)PyTuple_GET_SIZE(f->arg))
            return NULL;
        PyObject *v = PyTuple_GET_ITEM(f->arg, (Py_ssize_t)i);
        Py_INCREF(v);
        return v;
    }
    case OP_CONST: Py_INCREF(f->arg); return f->arg;
    case OP_CALL: {
        uint64_t k = rd_uint(rec + f->off, f->width);
        if (k == 0)
            Py_RETURN_NONE;
        PyObject *kind = PyLong_FromUnsignedLongLong(k);
        PyObject *a = epoch(rd_uint(rec + f->off2, 8), offset_ns);
        PyObject *b = epoch(rd_uint(rec + f->off3, 8), offset_ns);
        PyObject *r = NULL;
        if (kind != NULL && a != NULL && b != NULL)
            r = PyObject_CallFunctionObjArgs(f->arg, kind, a, b, NULL);
        Py_XDECREF(kind);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return r;
    }
    }
    return NULL;
}

/* The event of one record, a new reference; NULL: hand the record back (any exception cleared). */
static PyObject *make_event(const Decoder *d, const unsigned char *rec, long long offset_ns)
{
    PyObject *ev = d->cls->tp_alloc(d->cls, 0);
    if (ev == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < d->nfields; i++) {
        const field_t *f = &d->fields[i];
        PyObject *v = field_value(f, rec, offset_ns);
        if (v == NULL) {
            PyErr_Clear();
            Py_DECREF(ev); /* the slots filled so far are released by the type's dealloc */
            return NULL;
        }
        *(PyObject **)((char *)ev + f->slot) = v;
    }
    return ev;
}

static void Decoder_dealloc(Decoder *d)
{
    for (Py_ssize_t i = 0; i < d->nfields; i++)
        Py_XDECREF(d->fields[i].arg);
    PyMem_Free(d->fields);
    Py_XDECREF(d->cls);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static int read_field(Decoder *d, field_t *f, PyObject *spec)
{
    PyObject *name, *arg;
    if (!PyArg_ParseTuple(spec, "UiinOnn", &name, &f->op, &f->width, &f->off, &arg, &f->off2, &f->off3))
        return -1;
    if ((f->slot = slot_offset(d->cls, name)) < 0)
        return -1;
    if (f->op < OP_UINT || f->op > OP_CALL) {
        PyErr_Format(PyExc_ValueError, "field %U: unknown op %d", name, f->op);
        return -1;
    }
    if (f->op == OP_EPOCH)
        f->width = 8;
    if (f->width != 1 && f->width != 2 && f->width != 4 && f->width != 8) {
        PyErr_Format(PyExc_ValueError, "field %U: width %d", name, f->width);
        return -1;
    }
    Py_ssize_t ends[3] = {f->off + f->width, f->op == OP_CALL ? f->off2 + 8 : 0, f->op == OP_CALL ? f->off3 + 8 : 0};
    for (int i = 0; i < 3; i++)
        if (f->off < 0 || f->off2 < 0 || f->off3 < 0 || ends[i] > d->size) {
            PyErr_Format(PyExc_ValueError, "field %U lies outside the %zd-byte record", name, d->size);
            return -1;
        }
    if ((f->op == OP_INDEX && !PyTuple_Check(arg)) || (f->op == OP_CALL && !PyCallable_Check(arg))) {
        PyErr_Format(PyExc_TypeError, "field %U: OP_INDEX takes a tuple, OP_CALL a callable", name);
        return -1;
    }
    Py_INCREF(arg);
    f->arg = arg;
    if (PyUnicode_CompareWithASCIIString(name, "pid") == 0)
        d->pid_slot = f->slot;
    return 0;
}

static PyObject *Decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyTypeObject *cls;
    Py_ssize_t size;
    PyObject *specs;
    static char *kwlist[] = {"cls", "size", "fields", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!nO", kwlist, &PyType_Type, &cls, &size, &specs))
        return NULL;
    PyObject *seq = PySequence_Fast(specs, "fields must be a sequence");
    if (seq == NULL)
        return NULL;
    Decoder *d = (Decoder *)type->tp_alloc(type, 0);
    if (d == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_INCREF(cls);
    d->cls = cls;
    d->size = size;
    d->pid_slot = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    d->fields = PyMem_Calloc(n ? (size_t)n : 1, sizeof(field_t));
    if (d->fields == NULL) {
        Py_DECREF(seq);
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (read_field(d, &d->fields[i], PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            d->nfields = i; /* the args taken so far are released by dealloc */
            Py_DECREF(seq);
            Py_DECREF(d);
            return NULL;
        }
        d->nfields = i + 1;
    }
    Py_DECREF(seq);
    return (PyObject *)d;
}

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_ebpf.bpf._recdec.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One record type's layout and the event class its records become (module doc).",
    .tp_new = Decoder_new,
};

typedef struct {
    PyObject_HEAD
    Decoder *by_type[256]; /* borrowed from ``decoders``, which this holds */
    PyObject *decoders;
} Records;

static void Records_dealloc(Records *r)
{
    Py_XDECREF(r->decoders);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Records_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *decoders;
    static char *kwlist[] = {"decoders", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &PyDict_Type, &decoders))
        return NULL;
    Records *r = (Records *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    decoders = PyDict_Copy(decoders);
    if (decoders == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    r->decoders = decoders;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(decoders, &pos, &key, &value)) {
        long etype = PyLong_Check(key) ? PyLong_AsLong(key) : -1;
        if (etype < 0 || etype > 255 || !Py_IS_TYPE(value, &DecoderType)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "decoders maps a record type byte (0..255) to a Decoder");
            Py_DECREF(r);
            return NULL;
        }
        r->by_type[etype] = (Decoder *)value;
    }
    return (PyObject *)r;
}

/* Add ``pid`` (an event's slot value) to ``out`` when it is in neither ``seen`` nor ``added``. */
static int note_pid(PyObject *pid, PyObject *seen, PyObject *added, PyObject *out)
{
    int in = PyDict_Check(seen) ? PyDict_Contains(seen, pid) : PySequence_Contains(seen, pid);
    if (in == 0)
        in = PySet_Contains(added, pid);
    if (in != 0)
        return in < 0 ? -1 : 0;
    if (PySet_Add(added, pid) < 0)
        return -1;
    return PyList_Append(out, pid);
}

static PyObject *Records_decode(Records *r, PyObject *args)
{
    PyObject *records, *seen;
    long long offset_ns;
    if (!PyArg_ParseTuple(args, "O!LO", &PyList_Type, &records, &offset_ns, &seen))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), back = 0;
    PyObject *items = PyList_New(n), *added = PySet_New(NULL), *pids = PyList_New(0);
    if (items == NULL || added == NULL || pids == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(records, i), *ev = NULL;
        if (PyBytes_Check(raw) && PyBytes_GET_SIZE(raw) > 0) {
            const unsigned char *rec = (const unsigned char *)PyBytes_AS_STRING(raw);
            const Decoder *d = r->by_type[rec[0]];
            if (d != NULL && PyBytes_GET_SIZE(raw) >= d->size)
                ev = make_event(d, rec, offset_ns);
            if (ev != NULL && d->pid_slot >= 0 &&
                note_pid(*(PyObject **)((char *)ev + d->pid_slot), seen, added, pids) < 0) {
                Py_DECREF(ev);
                goto fail;
            }
        }
        if (ev == NULL) {
            Py_INCREF(raw);
            ev = raw;
            back++;
        }
        PyList_SET_ITEM(items, i, ev);
    }
    Py_DECREF(added);
    return Py_BuildValue("(NnN)", items, back, pids);
fail:
    Py_XDECREF(items);
    Py_XDECREF(added);
    Py_XDECREF(pids);
    return NULL;
}

static PyMethodDef Records_methods[] = {
    {"decode", (PyCFunction)Records_decode, METH_VARARGS,
     "decode(records, offset_ns, seen) -> (items, handed_back, new_pids) (module doc)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_ebpf.bpf._recdec.Records",
    .tp_basicsize = sizeof(Records),
    .tp_dealloc = (destructor)Records_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A receiver's decoders by record type byte (module doc).",
    .tp_methods = Records_methods,
    .tp_new = Records_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_ebpf.bpf._recdec",
    "Ring-buffer records decoded in C into typed events (otel_ebpf/bpf/records.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__recdec(void)
{
    if (PyType_Ready(&DecoderType) < 0 || PyType_Ready(&RecordsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    const struct { const char *name; int value; } ops[] = {
        {"OP_UINT", OP_UINT}, {"OP_SINT", OP_SINT}, {"OP_BOOL", OP_BOOL}, {"OP_EPOCH", OP_EPOCH},
        {"OP_INDEX", OP_INDEX}, {"OP_CONST", OP_CONST}, {"OP_CALL", OP_CALL},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (PyModule_AddIntConstant(m, ops[i].name, ops[i].value) < 0)
            goto fail;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0)
        goto fail;
    Py_INCREF(&RecordsType);
    if (PyModule_AddObject(m, "Records", (PyObject *)&RecordsType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
