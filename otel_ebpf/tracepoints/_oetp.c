/* otel_ebpf.tracepoints._oetp: the native probe site of the application tracepoints SDK.
 *
 * One USDT probe, otel_ebpf:event, with a semaphore (sys/sdt.h from systemtap-sdt-dev). A
 * tracer that attaches increments the semaphore (the kernel does it for uprobes opened with a
 * ref_ctr_offset, bpftrace/systemtap do it too), so enabled() is one memory read and fire()
 * is a nop sled plus argument set-up when nothing is attached.
 *
 * Arguments of otel_ebpf:event (stable; otel_ebpf/receivers/apptrace decodes them):
 *   1 kind        int      0 point, 1 span begin, 2 span end
 *   2 provider    char *   NUL-terminated provider name
 *   3 name        char *   NUL-terminated probe name
 *   4 trace_hi    u64      the app's current trace id, high 64 bits (0: no trace)
 *   5 trace_lo    u64      low 64 bits
 *   6 parent      u64      the app's current span id (0: none)
 *   7 span        u64      the id of the SDK span (begin/end), 0 for points
 *   8 payload     char *   NUL-terminated JSON object of the probe's arguments
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

__extension__ unsigned short otel_ebpf_event_semaphore __attribute__((unused)) __attribute__((section(".probes")));

static PyObject *oetp_enabled(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (__builtin_expect(*(volatile unsigned short *)&otel_ebpf_event_semaphore != 0, 0))
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *oetp_fire(PyObject *self, PyObject *args)
{
    int kind;
    const char *provider, *name, *payload;
    unsigned long long trace_hi, trace_lo, parent, span;
    (void)self;
    if (!PyArg_ParseTuple(args, "iyyKKKKy", &kind, &provider, &name, &trace_hi, &trace_lo, &parent, &span,
                          &payload))
        return NULL;
    STAP_PROBE8(otel_ebpf, event, kind, provider, name, trace_hi, trace_lo, parent, span, payload);
    Py_RETURN_NONE;
}

static PyObject *oetp_semaphore(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(*(volatile unsigned short *)&otel_ebpf_event_semaphore);
}

static PyMethodDef oetp_methods[] = {
    {"enabled", oetp_enabled, METH_NOARGS, "True while a tracer is attached to otel_ebpf:event."},
    {"fire", oetp_fire, METH_VARARGS,
     "fire(kind, provider, name, trace_hi, trace_lo, parent, span, payload): hit otel_ebpf:event."},
    {"semaphore", oetp_semaphore, METH_NOARGS, "The semaphore's value (number of attached tracers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef oetp_module = {
    PyModuleDef_HEAD_INIT, "_oetp", "USDT probe site otel_ebpf:event (see _oetp.c).", -1, oetp_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__oetp(void)
{
    return PyModule_Create(&oetp_module);
}
