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
 * instances' fields are read from their __dict__, see Span below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    unsigned char *data;
    size_t len, cap;
} Buf;

enum { OK = 0, SLOW = 1, FAIL = -1 }; /* SLOW: not on the fast path (the caller takes Python's); FAIL: an error is set */

static PyObject *span_kinds[5];
static PyObject *status_codes[3];

static PyObject *s_get_span_context, *s_parent, *s_name, *s_kind, *s_start_time, *s_end_time, *s_attributes,
    *s_dropped_attributes, *s_events, *s_dropped_events, *s_links, *s_dropped_links, *s_status, *s_trace_id,
    *s_span_id, *s_trace_state, *s_is_remote, *s_timestamp, *s_context, *s_status_code, *s_description,
    *s_resource, *s_instrumentation_scope, *s_schema_url, *s_version, *s__attributes, *s__context, *s__parent,
    *s__name, *s__kind, *s__start_time, *s__end_time, *s__events, *s__links, *s__status, *s__resource,
    *s__instrumentation_scope;
static PyTypeObject *span_context_type, *readable_span_type;

static int grow(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *d = PyMem_Realloc(b->data, cap);
    if (d == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    b->data = d;
    b->cap = cap;
    return OK;
}

static int put(Buf *b, const void *p, size_t n)
{
    if (grow(b, n))
        return FAIL;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return OK;
}

static int put_byte(Buf *b, unsigned char c)
{
    if (grow(b, 1))
        return FAIL;
    b->data[b->len++] = c;
    return OK;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static int put_varint(Buf *b, uint64_t v)
{
    if (grow(b, 10))
        return FAIL;
    while (v >= 0x80) {
        b->data[b->len++] = (unsigned char)(v & 0x7F) | 0x80;
        v >>= 7;
    }
    b->data[b->len++] = (unsigned char)v;
    return OK;
}

static int put_fixed64(Buf *b, uint64_t v)
{
    unsigned char out[8];
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
    return put(b, out, 8);
}

/* A length-delimited field: open() writes the tag and one byte for the length, close() writes the
 * length of what was written since, moving the body when the length needs more than one byte. */
static int open_field(Buf *b, unsigned char tag, size_t *mark)
{
    if (put_byte(b, tag) || put_byte(b, 0))
        return FAIL;
    *mark = b->len;
    return OK;
}

static int close_field(Buf *b, size_t mark)
{
    size_t n = b->len - mark, extra = varint_size(n) - 1;
    if (extra) {
        if (grow(b, extra))
            return FAIL;
        memmove(b->data + mark + extra, b->data + mark, n);
        b->len += extra;
    }
    size_t at = mark - 1;
    uint64_t v = n;
    while (v >= 0x80) {
        b->data[at++] = (unsigned char)(v & 0x7F) | 0x80;
        v >>= 7;
    }
    b->data[at] = (unsigned char)v;
    return OK;
}

static int put_bytes_field(Buf *b, unsigned char tag, const void *p, size_t n)
{
    if (put_byte(b, tag) || put_varint(b, n))
        return FAIL;
    return put(b, p, n);
}

/* A str's UTF-8 bytes: SLOW for anything but an exact str, and for a lone surrogate. */
static int utf8(PyObject *o, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(o))
        return SLOW;
    *p = PyUnicode_AsUTF8AndSize(o, n);
    if (*p == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_Clear();
            return SLOW;
        }
        return FAIL;
    }
    return OK;
}

/* A string field left out when the value is falsy (None, ""), as _string. */
static int put_string(Buf *b, unsigned char tag, PyObject *o)
{
    if (o == Py_None)
        return OK;
    const char *p;
    Py_ssize_t n;
    int r = utf8(o, &p, &n);
    if (r)
        return r;
    return n ? put_bytes_field(b, tag, p, (size_t)n) : OK;
}

/* An exact int in [0, 2**64) (unsigned) or [-2**63, 2**63) (signed, as its two's complement). */
static int as_u64(PyObject *o, uint64_t *v)
{
    if (!PyLong_CheckExact(o))
        return SLOW;
    *v = PyLong_AsUnsignedLongLong(o);
    if (*v == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return FAIL;
        PyErr_Clear();
        return SLOW;
    }
    return OK;
}

static int as_i64(PyObject *o, uint64_t *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred())
        return FAIL;
    if (overflow)
        return SLOW;
    *v = (uint64_t)x;
    return OK;
}

/* A fixed64 time field left out at 0 or None, as _time. */
static int put_time(Buf *b, unsigned char tag, PyObject *o)
{
    if (o == Py_None)
        return OK;
    uint64_t v;
    int r = as_u64(o, &v);
    if (r)
        return r;
    if (!v)
        return OK;
    return put_byte(b, tag) || put_fixed64(b, v) ? FAIL : OK;
}

/* A uint32 count field left out at 0, as _count. */
static int put_count(Buf *b, unsigned char tag, PyObject *o)
{
    uint64_t v;
    int r = as_u64(o, &v);
    if (r)
        return r;
    if (v >> 32)
        return SLOW;
    if (!v)
        return OK;
    return put_byte(b, tag) || put_varint(b, v) ? FAIL : OK;
}

static int put_count_attr(Buf *b, unsigned char tag, PyObject *obj, PyObject *name)
{
    PyObject *o = PyObject_GetAttr(obj, name);
    if (o == NULL)
        return FAIL;
    int r = put_count(b, tag, o);
    Py_DECREF(o);
    return r;
}

/* An id: an exact int below 2**(8*size), written big-endian as a bytes field of that size. */
static int put_id(Buf *b, unsigned char tag, PyObject *o, size_t size)
{
    unsigned char out[16];
    if (!PyLong_CheckExact(o))
        return SLOW;
    if (size == 8) {
        uint64_t v;
        int r = as_u64(o, &v);
        if (r)
            return r;
        for (int i = 0; i < 8; i++)
            out[i] = (unsigned char)(v >> (56 - 8 * i));
    } else {
#if PY_VERSION_HEX >= 0x030D0000
        Py_ssize_t need = PyLong_AsNativeBytes(o, out, (Py_ssize_t)size, Py_ASNATIVEBYTES_BIG_ENDIAN
                                               | Py_ASNATIVEBYTES_UNSIGNED_BUFFER | Py_ASNATIVEBYTES_REJECT_NEGATIVE);
        if (need < 0) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return FAIL;
            PyErr_Clear();
            return SLOW;
        }
        if ((size_t)need > size)
            return SLOW;
#else
        if (_PyLong_Sign(o) < 0)
            return SLOW;
        if (_PyLong_AsByteArray((PyLongObject *)o, out, size, 0, 0) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return FAIL;
            PyErr_Clear();
            return SLOW;
        }
#endif
    }
    return put_byte(b, tag) || put_byte(b, (unsigned char)size) || put(b, out, size) ? FAIL : OK;
}

static int put_attributes(Buf *b, unsigned char tag, PyObject *attributes);

#define MAX_DEPTH 32 /* arrays nested deeper: SLOW (Python's path decides) */

/* The AnyValue body of one attribute value, as _value (dict values: SLOW). */
static int put_value(Buf *b, PyObject *v, int depth)
{
    if (PyUnicode_CheckExact(v)) {
        const char *p;
        Py_ssize_t n;
        int r = utf8(v, &p, &n);
        return r ? r : put_bytes_field(b, 0x0a, p, (size_t)n);
    }
    if (PyLong_CheckExact(v)) {
        uint64_t x;
        int r = as_i64(v, &x);
        return r ? r : (put_byte(b, 0x18) || put_varint(b, x) ? FAIL : OK);
    }
    if (PyBool_Check(v))
        return put_byte(b, 0x10) || put_byte(b, v == Py_True) ? FAIL : OK;
    if (PyFloat_CheckExact(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_byte(b, 0x21) || put_fixed64(b, bits) ? FAIL : OK;
    }
    if (v == Py_None)
        return OK;
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
        size_t array, item;
        if (depth >= MAX_DEPTH)
            return SLOW;
        if (open_field(b, 0x2a, &array))
            return FAIL;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); i++) {
            if (open_field(b, 0x0a, &item))
                return FAIL;
            int r = put_value(b, PySequence_Fast_GET_ITEM(v, i), depth + 1);
            if (r || close_field(b, item))
                return r ? r : FAIL;
        }
        return close_field(b, array);
    }
    if (PyBytes_CheckExact(v))
        return put_bytes_field(b, 0x3a, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
    return SLOW;
}

static int put_key_value(Buf *b, unsigned char tag, PyObject *key, PyObject *value)
{
    size_t kv, any;
    const char *p;
    Py_ssize_t n;
    int r = utf8(key, &p, &n);
    if (r)
        return r;
    if (open_field(b, tag, &kv))
        return FAIL;
    if (n && put_bytes_field(b, 0x0a, p, (size_t)n))
        return FAIL;
    if (open_field(b, 0x12, &any))
        return FAIL;
    r = put_value(b, value, 0);
    if (r)
        return r;
    return close_field(b, any) || close_field(b, kv) ? FAIL : OK;
}

/* The repeated KeyValue field ``tag`` of a mapping (a dict or the SDK's MappingProxyType), as _attributes. */
static int put_attributes(Buf *b, unsigned char tag, PyObject *attributes)
{
    if (attributes == Py_None)
        return OK;
    if (PyDict_CheckExact(attributes)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(attributes, &pos, &k, &v)) {
            int r = put_key_value(b, tag, k, v);
            if (r)
                return r;
        }
        return OK;
    }
    PyObject *items = PyMapping_Items(attributes);
    if (items == NULL)
        return FAIL;
    int r = OK;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && !r; i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)
            r = SLOW;
        else
            r = put_key_value(b, tag, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
    }
    Py_DECREF(items);
    return r;
}

static int put_attributes_attr(Buf *b, unsigned char tag, PyObject *obj)
{
    PyObject *a = PyObject_GetAttr(obj, s_attributes);
    if (a == NULL)
        return FAIL;
    int r = put_attributes(b, tag, a);
    Py_DECREF(a);
    return r;
}

static int put_string_attr(Buf *b, unsigned char tag, PyObject *obj, PyObject *name)
{
    PyObject *o = PyObject_GetAttr(obj, name);
    if (o == NULL)
        return FAIL;
    int r = put_string(b, tag, o);
    Py_DECREF(o);
    return r;
}

static int put_time_attr(Buf *b, unsigned char tag, PyObject *obj, PyObject *name)
{
    PyObject *o = PyObject_GetAttr(obj, name);
    if (o == NULL)
        return FAIL;
    int r = put_time(b, tag, o);
    Py_DECREF(o);
    return r;
}

/* One Event message body, as _event. */
static int put_event(Buf *b, PyObject *e)
{
    int r;
    if ((r = put_time_attr(b, 0x09, e, s_timestamp)) || (r = put_string_attr(b, 0x12, e, s_name))
        || (r = put_attributes_attr(b, 0x1a, e)) || (r = put_count_attr(b, 0x20, e, s_dropped_attributes)))
        return r;
    return OK;
}

static int context_is_remote(PyObject *context);
static int put_context_id(Buf *b, unsigned char tag, PyObject *context, Py_ssize_t i, PyObject *public, size_t size);

/* One Link message body, as _link. */
static int put_link(Buf *b, PyObject *link)
{
    PyObject *context = PyObject_GetAttr(link, s_context);
    if (context == NULL)
        return FAIL;
    int r;
    if ((r = put_context_id(b, 0x0a, context, 0, s_trace_id, 16))
        || (r = put_context_id(b, 0x12, context, 1, s_span_id, 8)) || (r = put_attributes_attr(b, 0x22, link))
        || (r = put_count_attr(b, 0x28, link, s_dropped_attributes))) {
        Py_DECREF(context);
        return r;
    }
    int is_remote = context_is_remote(context);
    Py_DECREF(context);
    if (is_remote < 0)
        return FAIL;
    static const unsigned char local[] = {0x35, 0x00, 0x01, 0x00, 0x00}, far[] = {0x35, 0x00, 0x03, 0x00, 0x00};
    return put(b, is_remote ? far : local, 5);
}

/* A repeated message field from a sequence (events, links). */
static int put_sequence(Buf *b, unsigned char tag, PyObject *seq, int (*one)(Buf *, PyObject *))
{
    PyObject *fast = PySequence_Fast(seq, "not a sequence");
    if (fast == NULL)
        return FAIL;
    int r = OK;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && !r; i++) {
        size_t mark;
        if (open_field(b, tag, &mark))
            r = FAIL;
        else if (!(r = one(b, PySequence_Fast_GET_ITEM(fast, i))) && close_field(b, mark))
            r = FAIL;
    }
    Py_DECREF(fast);
    return r;
}

/* The Status field (15), written even when empty, as _status. */
static int put_status(Buf *b, PyObject *status)
{
    PyObject *code = PyObject_GetAttr(status, s_status_code);
    if (code == NULL)
        return FAIL;
    int number = -1;
    for (int i = 0; i < 3; i++)
        if (code == status_codes[i])
            number = i;
    Py_DECREF(code);
    if (number < 0)
        return SLOW;
    size_t mark;
    if (open_field(b, 0x7a, &mark))
        return FAIL;
    int r = put_string_attr(b, 0x12, status, s_description);
    if (r)
        return r;
    if (number && (put_byte(b, 0x18) || put_byte(b, (unsigned char)number)))
        return FAIL;
    return close_field(b, mark);
}

/* A span's members. The SDK's ReadableSpan properties return its own fields (``_name`` for ``name``...), or
 * wrap them (``attributes``: a MappingProxyType of ``_attributes``, readable only as a list of item tuples;
 * ``events``/``links``: a tuple copy); each property call runs Python code. The fields are read from the
 * span's instance dict when it has them, the public attribute otherwise (another class, another SDK). */
typedef struct {
    PyObject *span, *dict; /* dict: the span's __dict__, or NULL */
} Span;

static PyObject *member(const Span *s, PyObject *field, PyObject *public)
{
    if (s->dict != NULL) {
        PyObject *v = PyDict_GetItemWithError(s->dict, field);
        if (v != NULL)
            return Py_NewRef(v);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetAttr(s->span, public);
}

/* A SpanContext's item (trace_id 0, span_id 1, is_remote 2, trace_state 4): it is a tuple whose properties
 * return ``self[i]`` (opentelemetry-api 1.45, trace/span.py); the property for anything else. */
static PyObject *context_item(PyObject *context, Py_ssize_t i, PyObject *public)
{
    if (Py_TYPE(context) == span_context_type && PyTuple_GET_SIZE(context) > i)
        return Py_NewRef(PyTuple_GET_ITEM(context, i));
    return PyObject_GetAttr(context, public);
}

static int put_context_id(Buf *b, unsigned char tag, PyObject *context, Py_ssize_t i, PyObject *public, size_t size)
{
    PyObject *o = context_item(context, i, public);
    if (o == NULL)
        return FAIL;
    int r = put_id(b, tag, o, size);
    Py_DECREF(o);
    return r;
}

static int context_is_remote(PyObject *context)
{
    PyObject *remote = context_item(context, 2, s_is_remote);
    if (remote == NULL)
        return FAIL;
    int is_remote = PyObject_IsTrue(remote);
    Py_DECREF(remote);
    return is_remote;
}

static int put_member_time(Buf *b, unsigned char tag, const Span *s, PyObject *field, PyObject *public)
{
    PyObject *o = member(s, field, public);
    if (o == NULL)
        return FAIL;
    int r = put_time(b, tag, o);
    Py_DECREF(o);
    return r;
}

/* The parent's span id (4); *remote_parent for the flags. */
static int put_parent(Buf *b, const Span *s, int *remote_parent)
{
    PyObject *parent = member(s, s__parent, s_parent);
    if (parent == NULL)
        return FAIL;
    int r = PyObject_IsTrue(parent);
    *remote_parent = 0;
    if (r > 0 && !(r = put_context_id(b, 0x22, parent, 1, s_span_id, 8))) {
        *remote_parent = context_is_remote(parent);
        r = *remote_parent < 0 ? FAIL : OK;
    }
    Py_DECREF(parent);
    return r < 0 ? FAIL : r;
}

static int put_kind(Buf *b, const Span *s)
{
    PyObject *kind = member(s, s__kind, s_kind);
    if (kind == NULL)
        return FAIL;
    int number = -1;
    for (int i = 0; i < 5; i++)
        if (kind == span_kinds[i])
            number = i + 1;
    Py_DECREF(kind);
    if (number < 0)
        return SLOW;
    return put_byte(b, 0x30) || put_byte(b, (unsigned char)number) ? FAIL : OK;
}

/* Span fields 1-8 (ids, trace state, parent, name, kind, times), as _span_head; *remote_parent for flags. */
static int put_span_head(Buf *b, const Span *s, PyObject *context, int *remote_parent)
{
    int r;
    if ((r = put_context_id(b, 0x0a, context, 0, s_trace_id, 16))
        || (r = put_context_id(b, 0x12, context, 1, s_span_id, 8)))
        return r;
    PyObject *state = context_item(context, 4, s_trace_state);
    if (state == NULL)
        return FAIL;
    int has_state = PyObject_IsTrue(state);
    Py_DECREF(state);
    if (has_state)
        return has_state < 0 ? FAIL : SLOW;
    if ((r = put_parent(b, s, remote_parent)))
        return r;
    PyObject *name = member(s, s__name, s_name);
    if (name == NULL)
        return FAIL;
    r = put_string(b, 0x2a, name);
    Py_DECREF(name);
    if (r || (r = put_kind(b, s)) || (r = put_member_time(b, 0x39, s, s__start_time, s_start_time))
        || (r = put_member_time(b, 0x41, s, s__end_time, s_end_time)))
        return r;
    return OK;
}

/* A mapping or sequence field and its dropped count, as the properties give them: a BoundedAttributes or
 * BoundedList has its own count; a plain dict, list or tuple (or None) drops nothing. */
static int put_with_dropped(Buf *b, const Span *s, PyObject *field, PyObject *public, PyObject *dropped,
                            unsigned char tag, unsigned char dropped_tag, int (*one)(Buf *, unsigned char, PyObject *))
{
    PyObject *o = s->dict != NULL ? PyDict_GetItemWithError(s->dict, field) : NULL;
    int own = o != NULL; /* the field itself: its type says whether it counts drops (a property's copy does not) */
    o = own ? Py_NewRef(o) : PyErr_Occurred() ? NULL : PyObject_GetAttr(s->span, public);
    if (o == NULL)
        return FAIL;
    int plain = own && (o == Py_None || PyDict_CheckExact(o) || PyList_CheckExact(o) || PyTuple_CheckExact(o));
    int r = o == Py_None ? OK : one(b, tag, o);
    Py_DECREF(o);
    if (r || plain)
        return r;
    return put_count_attr(b, dropped_tag, s->span, dropped);
}

static int put_events(Buf *b, unsigned char tag, PyObject *events)
{
    return put_sequence(b, tag, events, put_event);
}

static int put_links(Buf *b, unsigned char tag, PyObject *links)
{
    return put_sequence(b, tag, links, put_link);
}

/* One Span message body, as _span. */
static int put_span(Buf *b, const Span *sp)
{
    const Span s = *sp;
    PyObject *context = s.dict != NULL ? PyDict_GetItemWithError(s.dict, s__context) : NULL;
    if (context != NULL)
        Py_INCREF(context);
    else if (!PyErr_Occurred())
        context = PyObject_CallMethodNoArgs(s.span, s_get_span_context);
    int r = FAIL, remote_parent = 0;
    if (context != NULL) {
        r = context == Py_None ? SLOW : put_span_head(b, &s, context, &remote_parent);
        Py_DECREF(context);
    }
    if (r || (r = put_with_dropped(b, &s, s__attributes, s_attributes, s_dropped_attributes, 0x4a, 0x50,
                                   put_attributes))
        || (r = put_with_dropped(b, &s, s__events, s_events, s_dropped_events, 0x5a, 0x60, put_events))
        || (r = put_with_dropped(b, &s, s__links, s_links, s_dropped_links, 0x6a, 0x70, put_links)))
        return r;
    PyObject *status = member(&s, s__status, s_status);
    if (status == NULL)
        return FAIL;
    r = status == Py_None ? OK : put_status(b, status);
    Py_DECREF(status);
    if (r)
        return r;
    static const unsigned char local[] = {0x85, 0x01, 0x00, 0x01, 0x00, 0x00},
                               far[] = {0x85, 0x01, 0x00, 0x03, 0x00, 0x00};
    return put(b, remote_parent ? far : local, 6);
}

/* ---- grouping: by resource, then scope, in first-appearance order (otlp_common.grouped) ---- */

typedef struct {
    PyObject *resource; /* the first span's of the group (a strong reference) */
    PyObject *scope;    /* a strong reference; Py_None for no scope */
    Buf spans;          /* the encoded ``spans`` fields (tag 0x12) of this scope */
} Group;

typedef struct {
    PyObject *resource, *scope; /* NULL: an empty slot */
    Py_ssize_t group;
} Seen;

typedef struct {
    Group *groups;
    Py_ssize_t n, cap;
    PyObject *resources; /* dict: resource -> list of group indexes, in order (the SDK objects' equality) */
    Seen *seen;          /* open addressing on the objects' addresses: each distinct pair is hashed by the SDK */
    size_t seen_n, seen_cap; /* once (a Resource's hash json-dumps its attributes), as otlp_common.grouped */
    PyObject *held;      /* list: the pairs' objects, kept alive so their addresses stay theirs */
} Groups;

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

/* The ``scope`` field (1) of a ScopeSpans, then its spans, then its schema URL, as _scope and _encode. */
static int put_scope_spans(Buf *b, Group *c)
{
    size_t block, head;
    int r;
    if (open_field(b, 0x12, &block) || open_field(b, 0x0a, &head))
        return FAIL;
    if (c->scope != Py_None
        && ((r = put_string_attr(b, 0x0a, c->scope, s_name)) || (r = put_string_attr(b, 0x12, c->scope, s_version))
            || (r = put_attributes_attr(b, 0x1a, c->scope))))
        return r;
    if (close_field(b, head) || put(b, c->spans.data, c->spans.len))
        return FAIL;
    if (c->scope != Py_None && (r = put_string_attr(b, 0x1a, c->scope, s_schema_url)))
        return r;
    return close_field(b, block);
}

static int put_request(Buf *b, Groups *g)
{
    PyObject *resource, *indexes;
    Py_ssize_t pos = 0;
    int r;
    while (PyDict_Next(g->resources, &pos, &resource, &indexes)) { /* insertion order: first appearance */
        Group *first = &g->groups[PyLong_AsSsize_t(PyList_GET_ITEM(indexes, 0))];
        size_t block, head;
        if (open_field(b, 0x0a, &block) || open_field(b, 0x0a, &head))
            return FAIL;
        if ((r = put_attributes_attr(b, 0x0a, first->resource)))
            return r;
        if (close_field(b, head))
            return FAIL;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(indexes); i++)
            if ((r = put_scope_spans(b, &g->groups[PyLong_AsSsize_t(PyList_GET_ITEM(indexes, i))])))
                return r;
        if ((r = put_string_attr(b, 0x1a, first->resource, s_schema_url)) || close_field(b, block))
            return r ? r : FAIL;
    }
    return OK;
}

static int encode(PyObject *fast, Buf *out)
{
    Groups g = {NULL, 0, 0, PyDict_New(), NULL, 0, 0, PyList_New(0)};
    Buf one = {NULL, 0, 0};
    PyObject *last_resource = NULL, *last_scope = NULL; /* strong: their addresses cannot be reused meanwhile */
    Group *last = NULL;
    int r = g.resources == NULL || g.held == NULL ? FAIL : OK;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && !r; i++) {
        Span span = {PySequence_Fast_GET_ITEM(fast, i), NULL};
        if (PyObject_TypeCheck(span.span, readable_span_type)) { /* its fields are the SDK's */
            span.dict = PyObject_GenericGetDict(span.span, NULL);
            if (span.dict == NULL)
                PyErr_Clear();
        }
        PyObject *resource = member(&span, s__resource, s_resource);
        PyObject *scope = resource ? member(&span, s__instrumentation_scope, s_instrumentation_scope) : NULL;
        if (scope == NULL) {
            Py_XDECREF(resource);
            Py_XDECREF(span.dict);
            r = FAIL;
            break;
        }
        int truthy = PyObject_IsTrue(scope); /* ``instrumentation_scope or None`` */
        if (truthy <= 0)
            Py_SETREF(scope, Py_NewRef(Py_None));
        if (truthy < 0) {
            r = FAIL;
        } else if (resource != last_resource || scope != last_scope) {
            last = group_of(&g, resource, scope);
            r = last == NULL ? FAIL : OK;
            Py_XSETREF(last_resource, Py_NewRef(resource));
            Py_XSETREF(last_scope, Py_NewRef(scope));
        }
        Py_DECREF(resource);
        Py_DECREF(scope);
        one.len = 0;
        if (!r && !(r = put_span(&one, &span)))
            r = put_byte(&last->spans, 0x12) || put_varint(&last->spans, one.len)
                || put(&last->spans, one.data, one.len) ? FAIL : OK;
        Py_XDECREF(span.dict);
    }
    Py_XDECREF(last_resource);
    Py_XDECREF(last_scope);
    if (!r)
        r = put_request(out, &g);
    PyMem_Free(one.data);
    groups_free(&g);
    return r;
}

static PyObject *encode_spans(PyObject *self, PyObject *spans)
{
    (void)self;
    if (readable_span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlpenc.setup() was not called");
        return NULL;
    }
    PyObject *fast = PySequence_Fast(spans, "spans must be a sequence");
    if (fast == NULL)
        return NULL;
    Buf out = {NULL, 0, 0};
    int r = encode(fast, &out);
    Py_DECREF(fast);
    PyObject *result = NULL;
    if (r == OK) {
        result = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len);
    } else if (r == SLOW) {
        result = Py_None;
        Py_INCREF(result);
    } else if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear(); /* a malformed span (no kind, a property that raises): Python's path decides */
        result = Py_None;
        Py_INCREF(result);
    }
    PyMem_Free(out.data);
    return result;
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
    return PyModule_Create(&module);
}
