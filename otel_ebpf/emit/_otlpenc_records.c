/* otel_ebpf.emit._otlpenc: span items, both formats. An item is the emitter's tuple (SpanRecord, Resource,
 * InstrumentationScope, trace id, span id) (otel_ebpf/emit/spans.py, SpanBuilder.item); it is written exactly as
 * the SDK's encoder writes the ReadableSpan SpanBuilder.readable makes of it, without making that span (its
 * dict, two SpanContexts, a Status, an Event or Link object each): tests/unit/emit/test_otlpenc.py compares the
 * bytes. What readable() does, and so what is written here:
 *   context (trace id, span id, not remote, sampled, no trace state); parent: (trace id, parent_span_id, remote)
 *   when parent_span_id is not None, so the flags say a remote parent (0x300), else 0x100; the kind from the
 *   record's string; end = max(end_ns, start_ns); the record's attributes dict as the span's, nothing dropped;
 *   events: Event(name, attributes, time_ns); links: Link(SpanContext(trace_id, span_id, remote), attributes);
 *   status: UNSET, or ERROR with the record's error as its description.
 * Anything else (attributes that are not an exact dict, events or links not in a tuple, a kind it does not
 * know, a time out of range) is SLOW: the caller makes the ReadableSpans and takes the path for them. */
#include "_otlpenc.h"

PyObject *s_start_ns, *s_end_ns, *s_parent_span_id, *s_error, *s_time_ns, *record_kinds[5];

typedef struct {
    PyObject *trace_id, *span_id;                                      /* borrowed from the item */
    PyObject *name, *attributes, *events, *links, *error, *parent_span_id; /* new references */
    uint64_t start, end;
    int kind; /* proto SpanKind: 1 internal .. 5 consumer */
} Rec;

static void rec_free(Rec *r)
{
    Py_CLEAR(r->name);
    Py_CLEAR(r->attributes);
    Py_CLEAR(r->events);
    Py_CLEAR(r->links);
    Py_CLEAR(r->error);
    Py_CLEAR(r->parent_span_id);
}

/* The proto number of a record's kind ("internal" .. "consumer": 1..5), 0 when it is none of them. */
static int kind_of(PyObject *kind)
{
    for (int i = 0; i < 5; i++)
        if (kind == record_kinds[i])
            return i + 1;
    if (!PyUnicode_CheckExact(kind))
        return 0;
    for (int i = 0; i < 5; i++)
        if (PyUnicode_Compare(kind, record_kinds[i]) == 0)
            return i + 1;
    return 0;
}

static int u64_of(PyObject *rec, PyObject *name, uint64_t *v)
{
    PyObject *o = PyObject_GetAttr(rec, name);
    if (o == NULL)
        return FAIL;
    int r = as_u64(o, v);
    Py_DECREF(o);
    return r;
}

/* The item's fields; on anything but OK, nothing is held. */
static int rec_read(Rec *r, PyObject *item)
{
    *r = (Rec){0};
    if (PyTuple_GET_SIZE(item) != 5)
        return SLOW;
    PyObject *rec = PyTuple_GET_ITEM(item, 0);
    r->trace_id = PyTuple_GET_ITEM(item, 3);
    r->span_id = PyTuple_GET_ITEM(item, 4);
    PyObject *kind = PyObject_GetAttr(rec, s_kind);
    if (kind == NULL)
        return FAIL;
    r->kind = kind_of(kind);
    Py_DECREF(kind);
    int x = r->kind ? OK : SLOW;
    if (!x && !(x = u64_of(rec, s_start_ns, &r->start)) && !(x = u64_of(rec, s_end_ns, &r->end))) {
        r->name = PyObject_GetAttr(rec, s_name);
        r->attributes = r->name ? PyObject_GetAttr(rec, s_attributes) : NULL;
        r->events = r->attributes ? PyObject_GetAttr(rec, s_events) : NULL;
        r->links = r->events ? PyObject_GetAttr(rec, s_links) : NULL;
        r->error = r->links ? PyObject_GetAttr(rec, s_error) : NULL;
        r->parent_span_id = r->error ? PyObject_GetAttr(rec, s_parent_span_id) : NULL;
        if (r->parent_span_id == NULL)
            x = FAIL;
        else if (!PyDict_CheckExact(r->attributes) || !PyTuple_CheckExact(r->events) || !PyTuple_CheckExact(r->links)
                 || (r->error != Py_None && !PyUnicode_CheckExact(r->error)))
            x = SLOW;
    }
    if (r->end < r->start)
        r->end = r->start;
    if (x)
        rec_free(r);
    return x;
}

/* ---- protobuf (as _otlpenc_spans.c: put_span, put_event, put_link, put_status) ---- */

static int put_u64_time(Buf *b, unsigned char tag, uint64_t v)
{
    return v && (put_byte(b, tag) || put_fixed64(b, v)) ? FAIL : OK;
}

static int put_rec_event(Buf *b, PyObject *e)
{
    PyObject *attributes = PyObject_GetAttr(e, s_attributes);
    if (attributes == NULL)
        return FAIL;
    int r = PyDict_CheckExact(attributes) ? OK : SLOW;
    if (!r && !(r = put_attr(b, 0x09, e, s_time_ns, put_time)) && !(r = put_attr(b, 0x12, e, s_name, put_string)))
        r = put_attributes(b, 0x1a, attributes);
    Py_DECREF(attributes);
    return r;
}

/* The three fields of a link record, new references; FAIL (nothing held) when one cannot be read. */
static int link_fields(PyObject *link, PyObject **trace, PyObject **span, PyObject **attributes)
{
    *trace = PyObject_GetAttr(link, s_trace_id);
    *span = *trace ? PyObject_GetAttr(link, s_span_id) : NULL;
    *attributes = *span ? PyObject_GetAttr(link, s_attributes) : NULL;
    if (*attributes != NULL && PyDict_CheckExact(*attributes))
        return OK;
    int r = *attributes == NULL ? FAIL : SLOW;
    Py_CLEAR(*trace);
    Py_CLEAR(*span);
    Py_CLEAR(*attributes);
    return r;
}

static int put_rec_link(Buf *b, PyObject *link)
{
    PyObject *trace, *span, *attributes;
    int r = link_fields(link, &trace, &span, &attributes);
    if (r)
        return r;
    static const unsigned char far[] = {0x35, 0x00, 0x03, 0x00, 0x00}; /* flags: a remote context */
    if (!(r = put_id(b, 0x0a, trace, 16)) && !(r = put_id(b, 0x12, span, 8)) && !(r = put_attributes(b, 0x22, attributes)))
        r = put(b, far, 5);
    Py_DECREF(trace);
    Py_DECREF(span);
    Py_DECREF(attributes);
    return r;
}

int put_record(Buf *b, PyObject *item)
{
    Rec s;
    int r = rec_read(&s, item);
    if (r)
        return r;
    int parent = s.parent_span_id != Py_None;
    if ((r = put_id(b, 0x0a, s.trace_id, 16)) || (r = put_id(b, 0x12, s.span_id, 8))
        || (parent && (r = put_id(b, 0x22, s.parent_span_id, 8))) || (r = put_string(b, 0x2a, s.name)))
        goto done;
    if (put_byte(b, 0x30) || put_byte(b, (unsigned char)s.kind) || put_u64_time(b, 0x39, s.start)
        || put_u64_time(b, 0x41, s.end)) {
        r = FAIL;
        goto done;
    }
    if ((r = put_attributes(b, 0x4a, s.attributes)) || (r = put_sequence(b, 0x5a, s.events, put_rec_event))
        || (r = put_sequence(b, 0x6a, s.links, put_rec_link)))
        goto done;
    size_t mark;
    if (open_field(b, 0x7a, &mark)) { /* the status, written even when empty */
        r = FAIL;
        goto done;
    }
    if (s.error != Py_None && ((r = put_string(b, 0x12, s.error)) || (r = put_byte(b, 0x18) || put_byte(b, 2) ? FAIL : OK)))
        goto done;
    static const unsigned char local[] = {0x85, 0x01, 0x00, 0x01, 0x00, 0x00},
                               far[] = {0x85, 0x01, 0x00, 0x03, 0x00, 0x00};
    r = close_field(b, mark) || put(b, parent ? far : local, 6) ? FAIL : OK;
done:
    rec_free(&s);
    return r;
}

/* ---- OTLP/JSON (as _otlpenc_json.c: put_jspan, put_jevent, put_jlink, put_jstatus) ---- */

static int put_rec_jevent(Buf *b, PyObject *e)
{
    int first = 1, r;
    PyObject *t = PyObject_GetAttr(e, s_time_ns);
    PyObject *name = t ? PyObject_GetAttr(e, s_name) : NULL;
    PyObject *attributes = name ? PyObject_GetAttr(e, s_attributes) : NULL;
    if (attributes == NULL)
        r = FAIL;
    else if (!PyDict_CheckExact(attributes))
        r = SLOW;
    else if (put_byte(b, '{'))
        r = FAIL;
    else if (!(r = put_jtime(b, JFIELD("timeUnixNano"), t, &first))
             && !(r = put_jstring(b, JFIELD("name"), name, &first)) && !(r = put_jattributes(b, attributes, &first)))
        r = put_byte(b, '}');
    Py_XDECREF(t);
    Py_XDECREF(name);
    Py_XDECREF(attributes);
    return r;
}

static int put_rec_jlink(Buf *b, PyObject *link)
{
    PyObject *trace, *span, *attributes;
    int r = link_fields(link, &trace, &span, &attributes), first = 0;
    if (r)
        return r;
    if (put_byte(b, '{'))
        r = FAIL;
    else if (!(r = put_jid_of(b, JFIELD("traceId"), trace, 16)) && !(r = put_byte(b, ','))
             && !(r = put_jid_of(b, JFIELD("spanId"), span, 8)) && !(r = put_jattributes(b, attributes, &first)))
        r = PUTS(b, ",\"flags\":768}");
    Py_DECREF(trace);
    Py_DECREF(span);
    Py_DECREF(attributes);
    return r;
}

/* ``,"<name>":[...]`` of a tuple of event or link records, left out when empty. */
static int put_rec_jlist(Buf *b, const char *name, size_t len, PyObject *tuple, int (*one)(Buf *, PyObject *))
{
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (!n)
        return OK;
    if (put_byte(b, ',') || put(b, name, len) || put_byte(b, '['))
        return FAIL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = (i && put_byte(b, ',')) ? FAIL : one(b, PyTuple_GET_ITEM(tuple, i));
        if (r)
            return r;
    }
    return put_byte(b, ']');
}

int put_jrecord(Buf *b, PyObject *item)
{
    Rec s;
    int r = rec_read(&s, item), first = 0;
    if (r)
        return r;
    int parent = s.parent_span_id != Py_None;
    if (put_byte(b, '{') || (r = put_jid_of(b, JFIELD("traceId"), s.trace_id, 16)) || put_byte(b, ',')
        || (r = put_jid_of(b, JFIELD("spanId"), s.span_id, 8))
        || (parent && (put_byte(b, ',') || (r = put_jid_of(b, JFIELD("parentSpanId"), s.parent_span_id, 8))))
        || (r = put_jstring(b, JFIELD("name"), s.name, &first)) || PUTS(b, ",\"kind\":")
        || put_decimal(b, (uint64_t)s.kind, 0) || put_jtime_u64(b, JFIELD("startTimeUnixNano"), s.start, &first)
        || put_jtime_u64(b, JFIELD("endTimeUnixNano"), s.end, &first) || (r = put_jattributes(b, s.attributes, &first))
        || (r = put_rec_jlist(b, JFIELD("events"), s.events, put_rec_jevent))
        || (r = put_rec_jlist(b, JFIELD("links"), s.links, put_rec_jlink)) || PUTS(b, ",\"status\":{")) {
        r = r ? r : FAIL;
        goto done;
    }
    if (s.error != Py_None) {
        int inner = 1;
        if ((r = put_jstring(b, JFIELD("message"), s.error, &inner)) || comma(b, &inner) || PUTS(b, "\"code\":2")) {
            r = r ? r : FAIL;
            goto done;
        }
    }
    r = (parent ? PUTS(b, "},\"flags\":768}") : PUTS(b, "},\"flags\":256}")) ? FAIL : OK;
done:
    rec_free(&s);
    return r;
}
