/* otel_ebpf.emit._otlpenc: reading spans the way the SDK's encoder does, for both formats. */
#include "_otlpenc.h"

/* A span's members. The SDK's ReadableSpan properties return its own fields (``_name`` for ``name``...), or
 * wrap them (``attributes``: a MappingProxyType of ``_attributes``, readable only as a list of item tuples;
 * ``events``/``links``: a tuple copy); each property call runs Python code. The fields are read as the span's own
 * when it has them, the public attribute otherwise (another class, another SDK). */

/* A ReadableSpan's own field: a new reference, NULL when it has none (no error) or with an error set. Looked up
 * without asking for __dict__: on CPython 3.11+ a span made by object.__new__ and setattr (ReadableSpan.__init__,
 * otlp_in's C decoder) keeps its fields in its own value array, and __dict__ would make a dict of them. */
PyObject *own_field(const Span *s, PyObject *field)
{
    PyObject *v = NULL;
    if (!s->own)
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject_GetOptionalAttr(s->span, field, &v);
#else
    _PyObject_LookupAttr(s->span, field, &v);
#endif
    return v;
}

PyObject *member(const Span *s, PyObject *field, PyObject *public)
{
    PyObject *v = own_field(s, field);
    return v != NULL || PyErr_Occurred() ? v : PyObject_GetAttr(s->span, public);
}

/* A SpanContext's item (trace_id 0, span_id 1, is_remote 2, trace_state 4): it is a tuple whose properties
 * return ``self[i]`` (opentelemetry-api 1.45, trace/span.py); the property for anything else. */
PyObject *context_item(PyObject *context, Py_ssize_t i, PyObject *public)
{
    if (Py_TYPE(context) == span_context_type && PyTuple_GET_SIZE(context) > i)
        return Py_NewRef(PyTuple_GET_ITEM(context, i));
    return PyObject_GetAttr(context, public);
}

/* The truth of a context's item: 1, 0, or FAIL. */
static int context_truth(PyObject *context, Py_ssize_t i, PyObject *public)
{
    PyObject *o = context_item(context, i, public);
    if (o == NULL)
        return FAIL;
    int truth = PyObject_IsTrue(o);
    Py_DECREF(o);
    return truth;
}

int context_is_remote(PyObject *context)
{
    return context_truth(context, 2, s_is_remote);
}

/* ``field`` of the span (``own``: from its own fields, whose type says whether it counts drops; a property's
 * copy does not), else the public attribute. A new reference, or NULL with an error set. */
PyObject *own_member(const Span *s, PyObject *field, PyObject *public, int *own)
{
    PyObject *o = own_field(s, field);
    *own = o != NULL;
    return o != NULL || PyErr_Occurred() ? o : PyObject_GetAttr(s->span, public);
}

/* Whether a field read by own_member drops nothing: a plain dict, list or tuple of the span's own (or None); a
 * BoundedAttributes or BoundedList has its own count, read through the public ``dropped_*`` property. */
int drops_nothing(PyObject *o, int own)
{
    return own && (o == Py_None || PyDict_CheckExact(o) || PyList_CheckExact(o) || PyTuple_CheckExact(o));
}

/* The span's context (``get_span_context()``): a new reference (maybe None), or NULL with an error set. */
PyObject *span_context(const Span *s)
{
    PyObject *context = own_field(s, s__context);
    return context != NULL || PyErr_Occurred() ? context : PyObject_CallMethodNoArgs(s->span, s_get_span_context);
}

/* Whether the context has a trace state: 1, 0, or FAIL. */
int has_trace_state(PyObject *context)
{
    return context_truth(context, 4, s_trace_state);
}

/* The proto number of the span's kind (1..5), 0 for another value (SLOW), or FAIL. */
int kind_number(const Span *s)
{
    PyObject *kind = member(s, s__kind, s_kind);
    if (kind == NULL)
        return FAIL;
    int number = 0;
    for (int i = 0; i < 5; i++)
        if (kind == span_kinds[i])
            number = i + 1;
    Py_DECREF(kind);
    return number;
}

/* The status code's number (0 UNSET, 1 OK, 2 ERROR), 3 for another value (SLOW), or FAIL. */
int status_number(PyObject *status)
{
    PyObject *code = PyObject_GetAttr(status, s_status_code);
    if (code == NULL)
        return FAIL;
    int number = 3;
    for (int i = 0; i < 3; i++)
        if (code == status_codes[i])
            number = i;
    Py_DECREF(code);
    return number;
}
