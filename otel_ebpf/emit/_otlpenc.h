/* What the files of otel_ebpf.emit._otlpenc share (the module's doc is in _otlpenc.c): the output buffer
 * and its protobuf primitives (static inline), the results, the names and classes set up at import, and the
 * functions each file offers the others. */
#ifndef OTEL_EBPF_OTLPENC_H
#define OTEL_EBPF_OTLPENC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    unsigned char *data;
    size_t len, cap;
} Buf;

enum { OK = 0, SLOW = 1, FAIL = -1 }; /* SLOW: not on the fast path (the caller takes Python's); FAIL: an error is set */

/* set up by _otlpenc.c: the SDK's enum members in order, its classes, interned attribute names */
extern PyObject *span_kinds[5];
extern PyObject *status_codes[3];
extern PyTypeObject *span_context_type, *readable_span_type;
extern PyObject *s_get_span_context, *s_parent, *s_name, *s_kind, *s_start_time, *s_end_time, *s_attributes,
    *s_dropped_attributes, *s_events, *s_dropped_events, *s_links, *s_dropped_links, *s_status, *s_trace_id,
    *s_span_id, *s_trace_state, *s_is_remote, *s_timestamp, *s_context, *s_status_code, *s_description,
    *s_resource, *s_instrumentation_scope, *s_schema_url, *s_version, *s__attributes, *s__context, *s__parent,
    *s__name, *s__kind, *s__start_time, *s__end_time, *s__events, *s__links, *s__status, *s__resource,
    *s__instrumentation_scope, *s__otlp_span, *s__oe_pb, *s__oe_json;

static inline int grow(Buf *b, size_t more)
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

static inline int put(Buf *b, const void *p, size_t n)
{
    if (grow(b, n))
        return FAIL;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return OK;
}

static inline int put_byte(Buf *b, unsigned char c)
{
    if (grow(b, 1))
        return FAIL;
    b->data[b->len++] = c;
    return OK;
}

static inline size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline int put_varint(Buf *b, uint64_t v)
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

static inline int put_fixed64(Buf *b, uint64_t v)
{
    unsigned char out[8];
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (8 * i));
    return put(b, out, 8);
}

/* A length-delimited field: open() writes the tag and one byte for the length, close() writes the
 * length of what was written since, moving the body when the length needs more than one byte. */
static inline int open_field(Buf *b, unsigned char tag, size_t *mark)
{
    if (put_byte(b, tag) || put_byte(b, 0))
        return FAIL;
    *mark = b->len;
    return OK;
}

static inline int close_field(Buf *b, size_t mark)
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

static inline int put_bytes_field(Buf *b, unsigned char tag, const void *p, size_t n)
{
    if (put_byte(b, tag) || put_varint(b, n))
        return FAIL;
    return put(b, p, n);
}

/* _otlpenc_values.c: strings, numbers, ids, attribute values and maps */
int utf8(PyObject *o, const char **p, Py_ssize_t *n);
int put_string(Buf *b, unsigned char tag, PyObject *o);
int as_u64(PyObject *o, uint64_t *v);
int as_i64(PyObject *o, uint64_t *v);
int put_time(Buf *b, unsigned char tag, PyObject *o);
int put_count(Buf *b, unsigned char tag, PyObject *o);
int put_id(Buf *b, unsigned char tag, PyObject *o, size_t size);
int put_value(Buf *b, PyObject *v, int depth);
int put_key_value(Buf *b, unsigned char tag, PyObject *key, PyObject *value);
int put_attributes(Buf *b, unsigned char tag, PyObject *attributes);
typedef int (*Put)(Buf *b, unsigned char tag, PyObject *o);
int put_attr(Buf *b, unsigned char tag, PyObject *obj, PyObject *name, Put put);
typedef int (*Write)(Buf *b, PyObject *o);
int put_kept(Buf *b, PyObject *obj, PyObject *key, Write write);

/* _otlpenc_jvalues.c: the same for OTLP/JSON. A field's name goes in as JFIELD("name"); *first: no comma yet */
#define PUTS(b, text) put(b, text, sizeof(text) - 1)
#define JFIELD(name) "\"" name "\":", sizeof("\"" name "\":") - 1
int comma(Buf *b, int *first);
int put_jstr(Buf *b, PyObject *o);
int put_decimal(Buf *b, uint64_t v, int negative);
int put_jtime(Buf *b, const char *name, size_t len, PyObject *o, int *first);
int put_jtime_u64(Buf *b, const char *name, size_t len, uint64_t v, int *first);
int put_jcount(Buf *b, const char *name, size_t len, PyObject *obj, PyObject *attr, int *first);
int put_jstring(Buf *b, const char *name, size_t len, PyObject *o, int *first);
int put_jstring_attr(Buf *b, const char *name, size_t len, PyObject *obj, PyObject *attr, int *first);
int put_jattributes(Buf *b, PyObject *attributes, int *first);
int put_jattributes_attr(Buf *b, PyObject *obj, int *first);
int put_jid(Buf *b, const char *name, size_t len, PyObject *context, Py_ssize_t i, PyObject *attr, size_t size);
int put_jid_of(Buf *b, const char *name, size_t len, PyObject *id, size_t size);

/* _otlpenc_read.c: a span's members as the SDK's encoder reads them. own: 1 when it is a ReadableSpan, whose own
 * fields (``_name``...) are read as they are, 0 for another object (its public attributes) */
typedef struct {
    PyObject *span;
    int own;
} Span;

PyObject *own_field(const Span *s, PyObject *field);

PyObject *member(const Span *s, PyObject *field, PyObject *public);
PyObject *own_member(const Span *s, PyObject *field, PyObject *public, int *own);
int drops_nothing(PyObject *o, int own);
PyObject *span_context(const Span *s);
PyObject *context_item(PyObject *context, Py_ssize_t i, PyObject *public);
int context_is_remote(PyObject *context);
int has_trace_state(PyObject *context);
int kind_number(const Span *s);
int status_number(PyObject *status);

/* _otlpenc.c: spans grouped by resource, then scope, in first-appearance order (otlp_common.grouped) */
typedef struct {
    PyObject *resource; /* the first span's of the group (a strong reference) */
    PyObject *scope;    /* a strong reference; Py_None for no scope */
    Buf spans;          /* this scope's spans, encoded and joined as the format joins them */
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

static inline Group *group_at(Groups *g, PyObject *indexes, Py_ssize_t i)
{
    return &g->groups[PyLong_AsSsize_t(PyList_GET_ITEM(indexes, i))];
}

/* An output format: one span, one span item, how a group joins its spans, the request around the groups. */
typedef struct {
    int (*span)(Buf *b, const Span *s);
    int (*record)(Buf *b, PyObject *item);
    int (*join)(Buf *group, const Buf *span);
    int (*request)(Buf *b, Groups *g);
} Format;

/* _otlpenc_spans.c: a repeated message field from a sequence (events, links), one() writing each body */
int put_sequence(Buf *b, unsigned char tag, PyObject *seq, int (*one)(Buf *, PyObject *));

/* _otlpenc_records.c: a span item (SpanBuilder.item's tuple) in each format, and the names it reads */
extern PyObject *s_start_ns, *s_end_ns, *s_parent_span_id, *s_error, *s_time_ns, *record_kinds[5];
int put_record(Buf *b, PyObject *item);
int put_jrecord(Buf *b, PyObject *item);

extern const Format PROTO; /* _otlpenc_spans.c: ExportTraceServiceRequest bytes */
extern const Format JSON;  /* _otlpenc_json.c: its OTLP/JSON line */

#endif
