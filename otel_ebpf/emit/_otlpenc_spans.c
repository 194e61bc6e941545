/* otel_ebpf.emit._otlpenc: one Span message body (otlp_proto.py's _span, _span_head, _event, _link, _status). */
#include "_otlpenc.h"

/* One Event message body, as _event. */
static int put_event(Buf *b, PyObject *e)
{
    int r;
    if ((r = put_attr(b, 0x09, e, s_timestamp, put_time)) || (r = put_attr(b, 0x12, e, s_name, put_string))
        || (r = put_attr(b, 0x1a, e, s_attributes, put_attributes)) || (r = put_attr(b, 0x20, e, s_dropped_attributes, put_count)))
        return r;
    return OK;
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


/* One Link message body, as _link. */
static int put_link(Buf *b, PyObject *link)
{
    PyObject *context = PyObject_GetAttr(link, s_context);
    if (context == NULL)
        return FAIL;
    int r;
    if ((r = put_context_id(b, 0x0a, context, 0, s_trace_id, 16))
        || (r = put_context_id(b, 0x12, context, 1, s_span_id, 8)) || (r = put_attr(b, 0x22, link, s_attributes, put_attributes))
        || (r = put_attr(b, 0x28, link, s_dropped_attributes, put_count))) {
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
int put_sequence(Buf *b, unsigned char tag, PyObject *seq, int (*one)(Buf *, PyObject *))
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
    int number = status_number(status);
    if (number < 0 || number > 2)
        return number < 0 ? FAIL : SLOW;
    size_t mark;
    if (open_field(b, 0x7a, &mark))
        return FAIL;
    int r = put_attr(b, 0x12, status, s_description, put_string);
    if (r)
        return r;
    if (number && (put_byte(b, 0x18) || put_byte(b, (unsigned char)number)))
        return FAIL;
    return close_field(b, mark);
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
    int number = kind_number(s);
    if (number <= 0)
        return number < 0 ? FAIL : SLOW;
    return put_byte(b, 0x30) || put_byte(b, (unsigned char)number) ? FAIL : OK;
}

/* Span fields 1-8 (ids, trace state, parent, name, kind, times), as _span_head; *remote_parent for flags. */
static int put_span_head(Buf *b, const Span *s, PyObject *context, int *remote_parent)
{
    int r;
    if ((r = put_context_id(b, 0x0a, context, 0, s_trace_id, 16))
        || (r = put_context_id(b, 0x12, context, 1, s_span_id, 8)))
        return r;
    int has_state = has_trace_state(context);
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

/* A mapping or sequence field and its dropped count, as the properties give them (drops_nothing). */
static int put_with_dropped(Buf *b, const Span *s, PyObject *field, PyObject *public, PyObject *dropped,
                            unsigned char tag, unsigned char dropped_tag, int (*one)(Buf *, unsigned char, PyObject *))
{
    int own;
    PyObject *o = own_member(s, field, public, &own);
    if (o == NULL)
        return FAIL;
    int plain = drops_nothing(o, own);
    int r = o == Py_None ? OK : one(b, tag, o);
    Py_DECREF(o);
    if (r || plain)
        return r;
    return put_attr(b, dropped_tag, s->span, dropped, put_count);
}

static int put_events(Buf *b, unsigned char tag, PyObject *events)
{
    return put_sequence(b, tag, events, put_event);
}

static int put_links(Buf *b, unsigned char tag, PyObject *links)
{
    return put_sequence(b, tag, links, put_link);
}

/* ---- a span as received (otel_ebpf.emit.otlp_in's ``_otlp_span``): its bytes, attributes added since spliced in */

/* The varint at *p, *p moved past it; -1 for bytes that end inside it (or one over 10 bytes). */
static int read_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    uint64_t out = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (*p >= end)
            return -1;
        unsigned char c = *(*p)++;
        out |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = out;
            return 0;
        }
    }
    return -1;
}

/* The end of the field at p (its number into *field), or NULL for bytes that end inside it or a group. */
static const unsigned char *field_end(const unsigned char *p, const unsigned char *end, uint32_t *field)
{
    uint64_t tag, n;
    if (read_varint(&p, end, &tag))
        return NULL;
    *field = (uint32_t)(tag >> 3);
    switch (tag & 7) {
    case 0: return read_varint(&p, end, &n) ? NULL : p;
    case 1: n = 8; break;
    case 5: n = 4; break;
    case 2:
        if (read_varint(&p, end, &n))
            return NULL;
        break;
    default: return NULL;
    }
    return n <= (uint64_t)(end - p) ? p + n : NULL;
}

/* The Span message body ``raw`` (the bytes it was received as) with each attribute the span's own dict holds beyond
 * the ones it was received with (added in place since: the collective join's nccl.wait_ns) written right after the
 * last received one (with none, before the first field above 9, else at the end): where protobuf's serializer
 * writes an added attribute, so a span received as the SDK encodes it leaves as the SDK would encode it changed;
 * other bytes keep their order, unknown fields and dropped counts (sent on, as a collector forwards them).
 * RECEIVED_STALE (nothing written) when the bytes cannot be the span's any more: fewer attributes than were
 * received, or not a plain dict, or bytes that do not parse; the caller then writes the span from its fields. */
#define RECEIVED_STALE 2
static int put_received(Buf *b, const Span *s, PyObject *raw)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(raw), *end = p + PyBytes_GET_SIZE(raw);
    const unsigned char *after_last = NULL, *first_above = end, *q = p;
    Py_ssize_t received = 0;
    while (q < end) {
        uint32_t field;
        const unsigned char *next = field_end(q, end, &field);
        if (next == NULL)
            return RECEIVED_STALE;
        if (field == 9) {
            received++;
            after_last = next;
        } else if (field > 9 && first_above == end) {
            first_above = q;
        }
        q = next;
    }
    const unsigned char *at = after_last != NULL ? after_last : first_above;
    PyObject *attrs = own_field(s, s__attributes);
    if (attrs == NULL)
        return PyErr_Occurred() ? FAIL : RECEIVED_STALE;
    int r = !PyDict_CheckExact(attrs) || PyDict_GET_SIZE(attrs) < received ? RECEIVED_STALE
            : put(b, p, (size_t)(at - p));
    PyObject *key, *value;
    Py_ssize_t pos = 0, i = 0;
    while (!r && PyDict_Next(attrs, &pos, &key, &value)) /* insertion order: the received ones first */
        if (i++ >= received)
            r = put_key_value(b, 0x4a, key, value);
    Py_DECREF(attrs);
    return r ? r : put(b, at, (size_t)(end - at));
}

/* One Span message body, as _span; a span with its received bytes (``_otlp_span``) as put_received. */
int put_span(Buf *b, const Span *sp)
{
    const Span s = *sp;
    PyObject *raw = own_field(&s, s__otlp_span);
    if (raw == NULL && PyErr_Occurred())
        return FAIL;
    if (raw != NULL) {
        int r = PyBytes_CheckExact(raw) ? put_received(b, &s, raw) : RECEIVED_STALE;
        Py_DECREF(raw);
        if (r != RECEIVED_STALE) /* RECEIVED_STALE: nothing written, the fields below instead */
            return r;
    }
    PyObject *context = span_context(&s);
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

/* ---- the request: resources, their scopes, their spans (otlp_proto.py's _scope and _encode) ---- */

static int join(Buf *group, const Buf *span)
{
    return put_byte(group, 0x12) || put_varint(group, span->len) || put(group, span->data, span->len) ? FAIL : OK;
}

/* The ``scope`` field (1) of a ScopeSpans, then its spans, then its schema URL, as _scope and _encode. */
static int put_scope_spans(Buf *b, Group *c)
{
    size_t block, head;
    int r;
    if (open_field(b, 0x12, &block) || open_field(b, 0x0a, &head))
        return FAIL;
    if (c->scope != Py_None
        && ((r = put_attr(b, 0x0a, c->scope, s_name, put_string)) || (r = put_attr(b, 0x12, c->scope, s_version, put_string))
            || (r = put_attr(b, 0x1a, c->scope, s_attributes, put_attributes))))
        return r;
    if (close_field(b, head) || put(b, c->spans.data, c->spans.len))
        return FAIL;
    if (c->scope != Py_None && (r = put_attr(b, 0x1a, c->scope, s_schema_url, put_string)))
        return r;
    return close_field(b, block);
}

/* ResourceSpans.resource: the Resource message, its attributes */
static int put_resource(Buf *b, PyObject *resource)
{
    size_t head;
    int r;
    if (open_field(b, 0x0a, &head))
        return FAIL;
    if ((r = put_attr(b, 0x0a, resource, s_attributes, put_attributes)))
        return r;
    return close_field(b, head);
}

static int put_request(Buf *b, Groups *g)
{
    PyObject *resource, *indexes;
    Py_ssize_t pos = 0;
    int r;
    while (PyDict_Next(g->resources, &pos, &resource, &indexes)) { /* insertion order: first appearance */
        Group *first = group_at(g, indexes, 0);
        size_t block;
        if (open_field(b, 0x0a, &block))
            return FAIL;
        if ((r = put_kept(b, first->resource, s__oe_pb, put_resource)))
            return r;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(indexes); i++)
            if ((r = put_scope_spans(b, group_at(g, indexes, i))))
                return r;
        if ((r = put_attr(b, 0x1a, first->resource, s_schema_url, put_string)) || close_field(b, block))
            return r ? r : FAIL;
    }
    return OK;
}

const Format PROTO = {put_span, put_record, join, put_request};
