/* otel_ebpf.bpf._ringread: BPF ring buffers read in C, their records handed to Python a batch at a time.
 *
 * BCC's RingBuf.open_ring_buffer (bcc 0.26, table.py) has libbpf call a ctypes callback for every record:
 * ctypes converts its three arguments, takes the GIL for the call and gives it back after it, and the record's
 * bytes are then copied again with ctypes.string_at. This module drives the same libbpf ring buffer manager
 * through the same libbcc entry points BCC's own poll uses (bpf_new_ringbuf, bpf_add_ringbuf, bpf_poll_ringbuf,
 * bpf_consume_ringbuf, bpf_free_ringbuf: bcc src/cc/libbpf.c, thin wrappers of libbpf's ring_buffer__new, __add,
 * __poll, __consume, __free), with a C callback that copies each record into a buffer of the reader's while the
 * GIL is released, then makes one ``bytes`` object per record, in the order libbpf read them (ring by ring, each
 * in submission order, as BCC's callbacks see them).
 *
 * Bounds: one call takes at most ``max_records`` records and ``max_bytes`` bytes (the callback answers -1 past
 * them: libbpf has then consumed the record that answered and stops, leaving the rest in the ring for the next
 * call; libbpf src/ringbuf.c ringbuf_process_ring, "update consumer pos and bail out"). A record the buffer cannot
 * grow for (no memory) is counted in ``lost``, never silently skipped.
 *
 * Reader(new, add, poll, consume, free, max_records, max_bytes): the five entry points as addresses (ctypes casts
 * of bcc.libbcc.lib's functions); add(map_fd); poll(timeout_ms) and consume() -> list of bytes; close() frees the
 * manager (also at deallocation). Not thread-safe: one thread polls (the receiver's poll thread); a call made
 * while another is in progress raises RuntimeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int (*sample_fn)(void *ctx, void *data, size_t size);
typedef void *(*new_fn)(int map_fd, sample_fn cb, void *ctx);
typedef int (*add_fn)(void *rb, int map_fd, sample_fn cb, void *ctx);
typedef int (*poll_fn)(void *rb, int timeout_ms);
typedef int (*consume_fn)(void *rb);
typedef void (*free_fn)(void *rb);

typedef struct {
    PyObject_HEAD
    new_fn new_rb;
    add_fn add;
    poll_fn poll;
    consume_fn consume;
    free_fn free_rb;
    void *rb;
    unsigned char *data; /* copied records, each a uint32_t size then its bytes */
    size_t len, cap, count, max_records, max_bytes;
    unsigned long long lost; /* records consumed that could not be kept (no memory) */
    int busy;
} Reader;

/* libbpf's sample callback, called without the GIL: copy the record, stop at the bounds. */
static int on_sample(void *ctx, void *sample, size_t size)
{
    Reader *r = ctx;
    size_t need = r->len + sizeof(uint32_t) + size;
    if (need > r->cap) {
        size_t cap = r->cap ? r->cap : 65536;
        while (cap < need)
            cap *= 2;
        unsigned char *d = realloc(r->data, cap); /* not PyMem: no GIL here */
        if (d == NULL) {
            r->lost++;
            return -1;
        }
        r->data = d;
        r->cap = cap;
    }
    uint32_t n = (uint32_t)size;
    memcpy(r->data + r->len, &n, sizeof n);
    memcpy(r->data + r->len + sizeof n, sample, size);
    r->len = need;
    r->count++;
    return r->count >= r->max_records || r->len >= r->max_bytes ? -1 : 0;
}

static int usable(Reader *r)
{
    if (r->rb == NULL) {
        PyErr_SetString(PyExc_ValueError, "the reader is closed or has no ring buffer");
        return 0;
    }
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the reader is in use by another thread");
        return 0;
    }
    return 1;
}

/* The records copied since the last call, as a list of bytes (the buffer is kept for the next call). */
static PyObject *records(Reader *r)
{
    PyObject *out = PyList_New((Py_ssize_t)r->count);
    size_t at = 0;
    for (size_t i = 0; out != NULL && i < r->count; i++) {
        uint32_t n;
        memcpy(&n, r->data + at, sizeof n);
        PyObject *b = PyBytes_FromStringAndSize((const char *)r->data + at + sizeof n, n);
        if (b == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, b);
        at += sizeof n + n;
    }
    r->len = r->count = 0;
    return out;
}

static PyObject *run(Reader *r, int timeout_ms, int polling)
{
    if (!usable(r))
        return NULL;
    r->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    if (polling)
        r->poll(r->rb, timeout_ms);
    else
        r->consume(r->rb);
    Py_END_ALLOW_THREADS
    r->busy = 0;
    return records(r);
}

static PyObject *reader_poll(Reader *r, PyObject *arg)
{
    int timeout_ms = PyLong_AsLong(arg);
    if (timeout_ms == -1 && PyErr_Occurred())
        return NULL;
    return run(r, timeout_ms, 1);
}

static PyObject *reader_consume(Reader *r, PyObject *noarg)
{
    (void)noarg;
    return run(r, 0, 0);
}

static PyObject *reader_add(Reader *r, PyObject *arg)
{
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the reader is in use by another thread");
        return NULL;
    }
    int failed;
    if (r->rb == NULL) {
        r->rb = r->new_rb(fd, on_sample, r);
        failed = r->rb == NULL;
    } else {
        failed = r->add(r->rb, fd, on_sample, r) < 0;
    }
    if (failed) {
        PyErr_Format(PyExc_OSError, "cannot open the ring buffer of map fd %d", fd);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *reader_close(Reader *r, PyObject *noarg)
{
    (void)noarg;
    if (r->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the reader is in use by another thread");
        return NULL;
    }
    if (r->rb != NULL) {
        r->free_rb(r->rb);
        r->rb = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *reader_lost(Reader *r, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(r->lost);
}

static void reader_dealloc(Reader *r)
{
    if (r->rb != NULL && !r->busy)
        r->free_rb(r->rb);
    free(r->data);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static void *address(PyObject *o)
{
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a NULL entry point");
    return p;
}

static int reader_init(Reader *r, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"new", "add", "poll", "consume", "free", "max_records", "max_bytes", NULL};
    PyObject *fns[5];
    Py_ssize_t max_records, max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnn", names, &fns[0], &fns[1], &fns[2], &fns[3], &fns[4],
                                     &max_records, &max_bytes))
        return -1;
    if (max_records < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "max_records and max_bytes must be >= 1");
        return -1;
    }
    void *p[5];
    for (int i = 0; i < 5; i++)
        if ((p[i] = address(fns[i])) == NULL)
            return -1;
    if (r->rb != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the reader is already set up");
        return -1;
    }
    r->new_rb = (new_fn)p[0];
    r->add = (add_fn)p[1];
    r->poll = (poll_fn)p[2];
    r->consume = (consume_fn)p[3];
    r->free_rb = (free_fn)p[4];
    r->max_records = (size_t)max_records;
    r->max_bytes = (size_t)max_bytes;
    return 0;
}

static PyMethodDef reader_methods[] = {
    {"add", (PyCFunction)reader_add, METH_O, "add(map_fd): read this ring buffer map too."},
    {"poll", (PyCFunction)reader_poll, METH_O,
     "poll(timeout_ms) -> [bytes]: wait up to timeout_ms for records (GIL released), then take those there."},
    {"consume", (PyCFunction)reader_consume, METH_NOARGS, "consume() -> [bytes]: the records there, no waiting."},
    {"close", (PyCFunction)reader_close, METH_NOARGS, "close(): free the ring buffer manager (safe twice)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef reader_getset[] = {
    {"lost", (getter)reader_lost, NULL, "records consumed that could not be kept (no memory)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_ebpf.bpf._ringread.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BPF ring buffers read through libbcc's libbpf manager; records returned as lists of bytes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ringread", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ringread(void)
{
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
