/* otel_ebpf.core._frozen: a fast_init dataclass's instances made from positional values in C (otel_ebpf.core.frozen).
 *
 * ``Cls(*values)`` on a frozen, slotted dataclass with fast_init's ``__init__`` runs type.__call__, object.__new__
 * and the generated Python ``__init__``, one descriptor store per field: ~0.7 us for a 14-field SpanRecord, most of
 * what a CUDA processor's span costs after its attributes (docs/benchmarks.md, issue 19). Maker(cls, slots,
 * defaults, required) makes the same instance without running Python code: the object from ``cls``'s ``tp_alloc``
 * (the one object.__new__ calls), each value stored in its slot as the member descriptor's store does (CPython 3.11
 * Objects/descrobject.c member_set -> Python/structmember.c PyMember_SetOne, T_OBJECT_EX), ``defaults[i]`` for each
 * slot past the values given. ``slots`` names the fields in ``__init__``'s order; ``defaults`` has an entry for
 * each, of which the first ``required`` (the fields without a default) are not used: those must be given
 * (TypeError otherwise, as ``__init__`` raises). Positional values only. A class with a ``default_factory`` field
 * is refused by the Python side (otel_ebpf.core.frozen.maker): its default is a fresh object per instance.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include "_slots.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t n, required;
    Py_ssize_t *offsets;
    PyObject **defaults; /* n entries; the first ``required`` are NULL */
} Maker;

static PyObject *Maker_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Maker *m = (Maker *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_Format(PyExc_TypeError, "%s maker takes positional values only", m->cls->tp_name);
        return NULL;
    }
    if (nargs < m->required || nargs > m->n) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd to %zd values (%zd given)", m->cls->tp_name, m->required, m->n,
                     nargs);
        return NULL;
    }
    PyObject *obj = m->cls->tp_alloc(m->cls, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < m->n; i++) {
        PyObject *v = i < nargs ? args[i] : m->defaults[i];
        Py_INCREF(v);
        *(PyObject **)((char *)obj + m->offsets[i]) = v;
    }
    return obj;
}

static void Maker_dealloc(Maker *m)
{
    if (m->defaults != NULL)
        for (Py_ssize_t i = 0; i < m->n; i++)
            Py_XDECREF(m->defaults[i]);
    PyMem_Free(m->defaults);
    PyMem_Free(m->offsets);
    Py_XDECREF(m->cls);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* Maker(cls, slots, defaults): ``defaults`` a tuple as long as ``slots`` whose first entries may be a sentinel
 * (``required`` of them: the fields without a default). */
static PyObject *Maker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyTypeObject *cls;
    PyObject *slots, *defaults;
    Py_ssize_t required;
    static char *kwlist[] = {"cls", "slots", "defaults", "required", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!n", kwlist, &PyType_Type, &cls, &PyTuple_Type, &slots,
                                     &PyTuple_Type, &defaults, &required))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (PyTuple_GET_SIZE(defaults) != n || required < 0 || required > n) {
        PyErr_SetString(PyExc_ValueError, "Maker: defaults must be as long as slots, required within it");
        return NULL;
    }
    Maker *m = (Maker *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->vectorcall = Maker_vectorcall;
    Py_INCREF(cls);
    m->cls = cls;
    m->offsets = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_ssize_t));
    m->defaults = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
    if (m->offsets == NULL || m->defaults == NULL) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    m->n = n;
    m->required = required;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((m->offsets[i] = slot_offset(cls, PyTuple_GET_ITEM(slots, i))) < 0) {
            Py_DECREF(m);
            return NULL;
        }
        if (i >= required) {
            m->defaults[i] = PyTuple_GET_ITEM(defaults, i);
            Py_INCREF(m->defaults[i]);
        }
    }
    return (PyObject *)m;
}

static PyObject *Maker_call(PyObject *self, PyObject *args, PyObject *kwds)
{
    return PyVectorcall_Call(self, args, kwds);
}

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_ebpf.core._frozen.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_dealloc = (destructor)Maker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = Maker_call,
    .tp_doc = "Maker(cls, slots, defaults, required)(*values) -> a cls instance (module doc).",
    .tp_new = Maker_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_ebpf.core._frozen",
    "fast_init dataclasses' instances made from positional values in C (otel_ebpf/core/frozen.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__frozen(void)
{
    if (PyType_Ready(&MakerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&MakerType);
    if (PyModule_AddObject(m, "Maker", (PyObject *)&MakerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
