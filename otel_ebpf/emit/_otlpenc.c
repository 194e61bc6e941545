/* otel_ebpf.emit._otlpenc: spans -> the bytes of an OTLP ExportTraceServiceRequest, in C.
 *
 * The same bytes as otel_ebpf/emit/otlp_proto.py's spans_to_otlp_proto, which writes exactly what
 * the SDK's path writes (opentelemetry-exporter-otlp-proto-common 1.45's encode_spans, then
 * protobuf's SerializeToString; opentelemetry-proto 1.45's trace.proto and common.proto): fields in
 * field-number order, scalars at their default left out, spans grouped by resource then scope in the
 * order each first appears (groups keyed by the SDK objects' equality, so equal resources share one),
 * a resource encoded once per batch. See that module's doc for the rules; this file follows it
 * function for function (_span, _attributes, _value, _event, _link, _status, _scope, _encode).
 *
 * encode_spans(spans) returns None for any span it does not write on its fast path (a trace state, a
 * dict attribute value, a value of another type, a string with a lone surrogate, an id or time out of
 * range, a subclass where the SDK has an exact type...): the caller then encodes the batch in Python,
 * which writes it exactly or refuses it. Only MemoryError propagates.
 *
 * setup(span_kinds, status_codes, SpanContext, ReadableSpan) is called once by the Python side: the SpanKind
 * members in enum order (INTERNAL=0 .. CONSUMER=4: proto values 1..5), the StatusCode members (UNSET, OK,
 * ERROR), the API's SpanContext class (a tuple: its items are read directly) and the SDK's ReadableSpan (its
 * instances' own fields are read as they are, not through its properties: _otlpenc_read.c).
 *
 * A span received over OTLP (its own field "_otlp_span" holds its Span message as received, otlp_in) is written as
 * those bytes with the attributes added to it since (_otlpenc_spans.c put_received; otlp_proto._received).
 *
 * A batch may also hold span items, the emitter's (SpanRecord, Resource, InstrumentationScope, trace id, span id)
 * tuples: they are written as the ReadableSpan otel_ebpf.emit.spans would make of them (_otlpenc_records.c); and
 * spans encoded ahead by encode_each, (Span message bytes, resource, scope) tuples: their bytes are joined as they
 * are (protobuf only).
 *
 * Files: _otlpenc.h (the buffer, shared declarations), _otlpenc_read.c (reading a span as the SDK does),
 * _otlpenc_values.c and _otlpenc_spans.c (protobuf: values and attributes; a span and the request),
 * _otlpenc_jvalues.c and _otlpenc_json.c (the same in OTLP/JSON), _otlpenc_records.c (span items, both
 * formats), this one (grouping, the module).
 */
#include "_otlpenc.h"

PyObject *span_kinds[5];
PyObject *status_codes[3];
PyTypeObject *span_context_type, *readable_span_type;
PyObject *s_get_span_context, *s_parent, *s_name, *s_kind, *s_start_time, *s_end_time, *s_attributes,
    *s_dropped_attributes, *s_events, *s_dropped_events, *s_links, *s_dropped_links, *s_status, *s_trace_id,
    *s_span_id, *s_trace_state, *s_is_remote, *s_timestamp, *s_context, *s_status_code, *s_description,
    *s_resource, *s_instrumentation_scope, *s_schema_url, *s_version, *s__attributes, *s__context, *s__parent,
    *s__name, *s__kind, *s__start_time, *s__end_time, *s__events, *s__links, *s__status, *s__resource,
    *s__instrumentation_scope, *s__otlp_span, *s__oe_pb, *s__oe_json;

/* ---- grouping: by resource, then scope, in first-appearance order (otlp_common.grouped) ---- */

static void groups_free(Groups *g)
{
    for (Py_ssize_t i = 0; i < g->n; i++) {
        PyMem_Free(g->groups[i].spans.data);
        Py_DECREF(g->groups[i].resource);
        Py_DECREF(g->groups[i].scope);
    }
    PyMem_Free(g->groups);
    PyMem_Free(g->seen);
    Py_XDECREF(g->resources);
    Py_XDECREF(g->held);
}

static size_t seen_slot(const Groups *g, PyObject *resource, PyObject *scope)
{
    size_t h = ((size_t)resource >> 4) * 0x9E3779B97F4A7C15ull ^ ((size_t)scope >> 4) * 0xC2B2AE3D27D4EB4Full;
    size_t i = (h >> 17) & (g->seen_cap - 1);
    while (g->seen[i].resource != NULL && (g->seen[i].resource != resource || g->seen[i].scope != scope))
        i = (i + 1) & (g->seen_cap - 1);
    return i;
}

static int seen_grow(Groups *g)
{
    size_t old_cap = g->seen_cap, cap = old_cap ? old_cap * 2 : 16;
    Seen *old = g->seen, *d = PyMem_Calloc(cap, sizeof(Seen));
    if (d == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    g->seen = d;
    g->seen_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].resource != NULL)
            g->seen[seen_slot(g, old[i].resource, old[i].scope)] = old[i];
    PyMem_Free(old);
    return OK;
}

static Group *group_by_equality(Groups *g, PyObject *resource, PyObject *scope);

/* The group of (resource, scope) objects: by their addresses once seen, else by equality. */
static Group *group_of(Groups *g, PyObject *resource, PyObject *scope)
{
    if (2 * (g->seen_n + 1) > g->seen_cap && seen_grow(g))
        return NULL;
    size_t i = seen_slot(g, resource, scope);
    if (g->seen[i].resource != NULL)
        return &g->groups[g->seen[i].group];
    Group *c = group_by_equality(g, resource, scope);
    if (c == NULL || PyList_Append(g->held, resource) < 0 || PyList_Append(g->held, scope) < 0)
        return NULL;
    g->seen[i] = (Seen){resource, scope, c - g->groups};
    g->seen_n++;
    return c;
}

/* The group of (resource, scope) by equality (Resource and InstrumentationScope hash and compare as in the
 * SDK's dicts), made when new. */
static Group *group_by_equality(Groups *g, PyObject *resource, PyObject *scope)
{
    PyObject *indexes = PyDict_GetItemWithError(g->resources, resource);
    if (indexes == NULL) {
        if (PyErr_Occurred())
            return NULL;
        indexes = PyList_New(0);
        if (indexes == NULL || PyDict_SetItem(g->resources, resource, indexes) < 0) {
            Py_XDECREF(indexes);
            return NULL;
        }
        Py_DECREF(indexes); /* the dict holds it */
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(indexes); i++) {
        Group *c = &g->groups[PyLong_AsSsize_t(PyList_GET_ITEM(indexes, i))];
        int same = c->scope == scope ? 1 : PyObject_RichCompareBool(c->scope, scope, Py_EQ);
        if (same < 0)
            return NULL;
        if (same)
            return c;
    }
    if (g->n == g->cap) {
        Py_ssize_t cap = g->cap ? g->cap * 2 : 8;
        Group *d = PyMem_Realloc(g->groups, (size_t)cap * sizeof(Group));
        if (d == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        g->groups = d;
        g->cap = cap;
    }
    PyObject *index = PyLong_FromSsize_t(g->n);
    if (index == NULL || PyList_Append(indexes, index) < 0) {
        Py_XDECREF(index);
        return NULL;
    }
    Py_DECREF(index);
    Group *c = &g->groups[g->n++];
    c->resource = Py_NewRef(resource);
    c->scope = Py_NewRef(scope);
    c->spans = (Buf){NULL, 0, 0};
    return c;
}

/* A span encoded ahead (encode_each): the tuple (Span message bytes, resource, scope). */
static inline int is_encoded(PyObject *o)
{
    return PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 3 && PyBytes_CheckExact(PyTuple_GET_ITEM(o, 0));
}

/* The resource and scope a span is grouped by (new references; the scope None when falsy, as ``instrumentation_scope
 * or None``), read as the SDK's encoder reads them: a span item's and an encoded span's from the tuple. FAIL with an
 * error set. */
static int resource_scope(const Span *span, int tuple, PyObject **resource, PyObject **scope)
{
    *resource = tuple ? Py_NewRef(PyTuple_GET_ITEM(span->span, 1)) : member(span, s__resource, s_resource);
    *scope = *resource == NULL ? NULL
             : tuple           ? Py_NewRef(PyTuple_GET_ITEM(span->span, 2))
                               : member(span, s__instrumentation_scope, s_instrumentation_scope);
    if (*scope == NULL) {
        Py_CLEAR(*resource);
        return FAIL;
    }
    int truthy = PyObject_IsTrue(*scope);
    if (truthy <= 0)
        Py_SETREF(*scope, Py_NewRef(Py_None));
    if (truthy < 0) {
        Py_CLEAR(*resource);
        Py_CLEAR(*scope);
        return FAIL;
    }
    return OK;
}

static int encode(PyObject *fast, Buf *out, const Format *f)
{
    Groups g = {NULL, 0, 0, PyDict_New(), NULL, 0, 0, PyList_New(0)};
    Buf one = {NULL, 0, 0};
    PyObject *last_resource = NULL, *last_scope = NULL; /* strong: their addresses cannot be reused meanwhile */
    Group *last = NULL;
    int r = g.resources == NULL || g.held == NULL ? FAIL : OK;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && !r; i++) {
        Span span = {PySequence_Fast_GET_ITEM(fast, i), 0};
        int tuple = PyTuple_CheckExact(span.span), encoded = is_encoded(span.span);
        if ((tuple && !encoded && PyTuple_GET_SIZE(span.span) != 5) || (encoded && f != &PROTO)) {
            r = SLOW; /* not a span item (_otlpenc_records.c); an encoded span is protobuf only */
            break;
        }
        span.own = !tuple && PyObject_TypeCheck(span.span, readable_span_type); /* its fields are the SDK's */
        PyObject *resource, *scope;
        if ((r = resource_scope(&span, tuple, &resource, &scope)))
            break;
        if (resource != last_resource || scope != last_scope) {
            last = group_of(&g, resource, scope);
            r = last == NULL ? FAIL : OK;
            Py_XSETREF(last_resource, Py_NewRef(resource));
            Py_XSETREF(last_scope, Py_NewRef(scope));
        }
        Py_DECREF(resource);
        Py_DECREF(scope);
        if (r)
            break;
        if (encoded) { /* its bytes as they are */
            PyObject *body = PyTuple_GET_ITEM(span.span, 0);
            const Buf ahead = {(unsigned char *)PyBytes_AS_STRING(body), (size_t)PyBytes_GET_SIZE(body), 0};
            r = f->join(&last->spans, &ahead);
            continue;
        }
        one.len = 0;
        if (!(r = tuple ? f->record(&one, span.span) : f->span(&one, &span)))
            r = f->join(&last->spans, &one);
    }
    Py_XDECREF(last_resource);
    Py_XDECREF(last_scope);
    if (!r)
        r = f->request(out, &g);
    PyMem_Free(one.data);
    groups_free(&g);
    return r;
}

/* ``spans`` as a fast sequence (a new reference), or NULL with an error set: not a sequence, or setup() not called. */
static PyObject *spans_sequence(PyObject *spans)
{
    if (readable_span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlpenc.setup() was not called");
        return NULL;
    }
    return PySequence_Fast(spans, "spans must be a sequence");
}

/* encode_each(spans): a list of the same length, each span (an SDK span or a span item) as the tuple (its Span
 * message bytes, its resource, its scope or None) that encode_spans takes for it, or as it is when it is not on the
 * fast path (encode_spans hands back the batch it is in, as before). A sending queue encodes what it takes (the
 * gateway: spans the join has just released, still in the CPU's caches, and freed there) and its thread then only
 * joins bytes. NULL on MemoryError. */
static PyObject *encode_each(PyObject *self, PyObject *spans)
{
    (void)self;
    PyObject *fast = spans_sequence(spans);
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    Buf one = {NULL, 0, 0};
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        Span span = {PySequence_Fast_GET_ITEM(fast, i), 0};
        int tuple = PyTuple_CheckExact(span.span);
        PyObject *got = NULL, *resource = NULL, *scope = NULL;
        if (is_encoded(span.span) || (tuple && PyTuple_GET_SIZE(span.span) != 5)) {
            got = Py_NewRef(span.span);
        } else {
            span.own = !tuple && PyObject_TypeCheck(span.span, readable_span_type);
            one.len = 0;
            int r = resource_scope(&span, tuple, &resource, &scope);
            if (!r)
                r = tuple ? PROTO.record(&one, span.span) : PROTO.span(&one, &span);
            if (!r) {
                PyObject *body = PyBytes_FromStringAndSize((const char *)one.data, (Py_ssize_t)one.len);
                got = body == NULL ? NULL : PyTuple_Pack(3, body, resource, scope);
                Py_XDECREF(body);
            } else if (r == SLOW || !PyErr_ExceptionMatches(PyExc_MemoryError)) {
                PyErr_Clear(); /* as encode_as: Python's path decides, in the batch */
                got = Py_NewRef(span.span);
            }
            Py_XDECREF(resource);
            Py_XDECREF(scope);
        }
        if (got == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, got);
    }
    PyMem_Free(one.data);
    Py_DECREF(fast);
    return out;
}

#define SPARE_MAX ((size_t)16 << 20) /* the most a kept request buffer holds on to */

/* ``spans`` in format ``f``: bytes (or an ASCII str) when written, None when handed back, NULL on MemoryError. */
static PyObject *encode_as(PyObject *spans, const Format *f, int text)
{
    PyObject *fast = spans_sequence(spans);
    if (fast == NULL)
        return NULL;
    /* The request is written into a buffer kept from one call to the next (up to SPARE_MAX): a gateway's request
     * of 2,048 spans is ~1 MB, and a fresh one grew by doubling through pages the kernel had to fault in, each
     * call (perf: ~20 % of the encode in the kernel). Another thread may call meanwhile (the Python code a span's
     * properties run can let it): it gets a buffer of its own. */
    static Buf spare = {NULL, 0, 0};
    static int spare_busy = 0;
    int mine = !spare_busy;
    Buf out = {NULL, 0, 0};
    if (mine) {
        spare_busy = 1;
        out = spare;
        out.len = 0;
    }
    int r = encode(fast, &out, f);
    Py_DECREF(fast);
    PyObject *result = NULL;
    if (r == OK && text) {
        result = PyUnicode_DecodeASCII((const char *)out.data, (Py_ssize_t)out.len, NULL);
    } else if (r == OK) {
        result = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len);
    } else if (r == SLOW || !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear(); /* a malformed span (no kind, a property that raises): Python's path decides */
        result = Py_NewRef(Py_None);
    }
    if (mine && out.cap <= SPARE_MAX) {
        spare = out;
    } else {
        PyMem_Free(out.data);
        if (mine)
            spare = (Buf){NULL, 0, 0};
    }
    if (mine)
        spare_busy = 0;
    return result;
}

static PyObject *encode_spans(PyObject *self, PyObject *spans)
{
    (void)self;
    return encode_as(spans, &PROTO, 0);
}

static PyObject *encode_spans_json(PyObject *self, PyObject *spans)
{
    (void)self;
    return encode_as(spans, &JSON, 1);
}

static PyObject *setup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *kinds, *codes, *context_type, *span_type;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyTuple_Type, &kinds, &PyTuple_Type, &codes, &PyType_Type,
                          &context_type, &PyType_Type, &span_type))
        return NULL;
    if (PyTuple_GET_SIZE(kinds) != 5 || PyTuple_GET_SIZE(codes) != 3) {
        PyErr_SetString(PyExc_ValueError, "setup(5 span kinds, 3 status codes)");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        Py_XSETREF(span_kinds[i], Py_NewRef(PyTuple_GET_ITEM(kinds, i)));
    }
    for (int i = 0; i < 3; i++) {
        Py_XSETREF(status_codes[i], Py_NewRef(PyTuple_GET_ITEM(codes, i)));
    }
    Py_XSETREF(span_context_type, (PyTypeObject *)Py_NewRef(context_type));
    Py_XSETREF(readable_span_type, (PyTypeObject *)Py_NewRef(span_type));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode_spans", encode_spans, METH_O,
     "encode_spans(spans) -> the ExportTraceServiceRequest bytes, or None when a span is not on the fast path."},
    {"encode_spans_json", encode_spans_json, METH_O,
     "encode_spans_json(spans) -> its OTLP/JSON line (a str), or None when a span is not on the fast path."},
    {"encode_each", encode_each, METH_O,
     "encode_each(spans) -> each span as (Span bytes, resource, scope), or as it is when not on the fast path."},
    {"setup", setup, METH_VARARGS, "setup(span_kinds, status_codes, SpanContext, ReadableSpan): the enum members in order, and two classes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpenc", NULL, -1, methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                              \
    return NULL

PyMODINIT_FUNC PyInit__otlpenc(void)
{
    INTERN(s_get_span_context, "get_span_context");
    INTERN(s_parent, "parent");
    INTERN(s_name, "name");
    INTERN(s_kind, "kind");
    INTERN(s_start_time, "start_time");
    INTERN(s_end_time, "end_time");
    INTERN(s_attributes, "attributes");
    INTERN(s_dropped_attributes, "dropped_attributes");
    INTERN(s_events, "events");
    INTERN(s_dropped_events, "dropped_events");
    INTERN(s_links, "links");
    INTERN(s_dropped_links, "dropped_links");
    INTERN(s_status, "status");
    INTERN(s_trace_id, "trace_id");
    INTERN(s_span_id, "span_id");
    INTERN(s_trace_state, "trace_state");
    INTERN(s_is_remote, "is_remote");
    INTERN(s_timestamp, "timestamp");
    INTERN(s_context, "context");
    INTERN(s_status_code, "status_code");
    INTERN(s_description, "description");
    INTERN(s_resource, "resource");
    INTERN(s_instrumentation_scope, "instrumentation_scope");
    INTERN(s_schema_url, "schema_url");
    INTERN(s_version, "version");
    INTERN(s__attributes, "_attributes");
    INTERN(s__context, "_context");
    INTERN(s__parent, "_parent");
    INTERN(s__name, "_name");
    INTERN(s__kind, "_kind");
    INTERN(s__start_time, "_start_time");
    INTERN(s__end_time, "_end_time");
    INTERN(s__events, "_events");
    INTERN(s__links, "_links");
    INTERN(s__status, "_status");
    INTERN(s__resource, "_resource");
    INTERN(s__instrumentation_scope, "_instrumentation_scope");
    INTERN(s__otlp_span, "_otlp_span");
    INTERN(s__oe_pb, "_oe_otlp_pb");
    INTERN(s__oe_json, "_oe_otlp_json");
    INTERN(s_start_ns, "start_ns");
    INTERN(s_end_ns, "end_ns");
    INTERN(s_parent_span_id, "parent_span_id");
    INTERN(s_error, "error");
    INTERN(s_time_ns, "time_ns");
    INTERN(record_kinds[0], "internal"); /* SpanRecord.kind, in proto SpanKind order (1..5) */
    INTERN(record_kinds[1], "server");
    INTERN(record_kinds[2], "client");
    INTERN(record_kinds[3], "producer");
    INTERN(record_kinds[4], "consumer");
    return PyModule_Create(&module);
}
