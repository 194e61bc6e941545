/* otel_ebpf.emit._otlpenc: spans as one OTLP/JSON line, the string otlp_json.py's spans_to_otlp_json returns
 * (function for function: _str, _double, _value, _attributes, _event, _link, _status, _span_head, _span,
 * _scope, _resource, _encode: the values in _otlpenc_jvalues.c; see that module's doc for the rules: protobuf's json_format with integer enums,
 * json.dumps's compact separators and ASCII escapes, ids in hex). Dict values, a trace state, and anything
 * otlp_json.py would refuse are SLOW: the batch goes back to Python. */
#include "_otlpenc.h"

static int put_jflags(Buf *b, int remote)
{
    return remote ? PUTS(b, ",\"flags\":768") : PUTS(b, ",\"flags\":256");
}

static int put_jevent(Buf *b, PyObject *e)
{
    int first = 1, r = OK;
    PyObject *t = PyObject_GetAttr(e, s_timestamp);
    if (t == NULL || put_byte(b, '{'))
        return Py_XDECREF(t), FAIL;
    r = put_jtime(b, JFIELD("timeUnixNano"), t, &first);
    Py_DECREF(t);
    if (r || (r = put_jstring_attr(b, JFIELD("name"), e, s_name, &first)) || (r = put_jattributes_attr(b, e, &first))
        || (r = put_jcount(b, JFIELD("droppedAttributesCount"), e, s_dropped_attributes, &first)))
        return r;
    return put_byte(b, '}');
}

static int put_jlink(Buf *b, PyObject *link)
{
    int first = 0, r = OK;
    PyObject *context = PyObject_GetAttr(link, s_context);
    if (context == NULL || put_byte(b, '{'))
        return Py_XDECREF(context), FAIL;
    if ((r = put_jid(b, JFIELD("traceId"), context, 0, s_trace_id, 16)) || (r = put_byte(b, ','))
        || (r = put_jid(b, JFIELD("spanId"), context, 1, s_span_id, 8)) || (r = put_jattributes_attr(b, link, &first))
        || (r = put_jcount(b, JFIELD("droppedAttributesCount"), link, s_dropped_attributes, &first))) {
        Py_DECREF(context);
        return r;
    }
    int remote = context_is_remote(context);
    Py_DECREF(context);
    return remote < 0 || put_jflags(b, remote) ? FAIL : put_byte(b, '}');
}

/* ``"<name>":[...]`` of events or links with their dropped count (drops_nothing). */
static int put_jlist(Buf *b, const Span *s, PyObject *field, PyObject *attr, const char *name, size_t len,
                     PyObject *dropped, const char *dname, size_t dlen, int (*one)(Buf *, PyObject *))
{
    int own, first = 0;
    PyObject *o = own_member(s, field, attr, &own);
    if (o == NULL)
        return FAIL;
    int plain = drops_nothing(o, own);
    PyObject *fast = o == Py_None ? NULL : PySequence_Fast(o, "not a sequence");
    Py_DECREF(o);
    int r = o != Py_None && fast == NULL ? FAIL : OK;
    Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    if (n && (put_byte(b, ',') || put(b, name, len) || put_byte(b, '[')))
        r = FAIL;
    for (Py_ssize_t i = 0; i < n && !r; i++)
        r = (i && put_byte(b, ',')) ? FAIL : one(b, PySequence_Fast_GET_ITEM(fast, i));
    Py_XDECREF(fast);
    if (r || (n && put_byte(b, ']')))
        return r ? r : FAIL;
    return plain ? OK : put_jcount(b, dname, dlen, s->span, dropped, &first);
}

static int put_jstatus(Buf *b, PyObject *status)
{
    int number = status_number(status), first = 1, r = OK;
    if (number < 0 || number > 2)
        return number < 0 ? FAIL : SLOW;
    if (PUTS(b, ",\"status\":{") || (r = put_jstring_attr(b, JFIELD("message"), status, s_description, &first)))
        return r ? r : FAIL;
    if (number && (comma(b, &first) || PUTS(b, "\"code\":") || put_decimal(b, (uint64_t)number, 0)))
        return FAIL;
    return put_byte(b, '}');
}

/* Fields 1-8 (_span_head); *remote for the flags. */
static int put_jhead(Buf *b, const Span *s, PyObject *context, int *remote)
{
    int r = OK, first = 0;
    if (put_byte(b, '{') || (r = put_jid(b, JFIELD("traceId"), context, 0, s_trace_id, 16)) || put_byte(b, ',')
        || (r = put_jid(b, JFIELD("spanId"), context, 1, s_span_id, 8)))
        return r ? r : FAIL;
    if ((r = has_trace_state(context)))
        return r < 0 ? FAIL : SLOW;
    PyObject *parent = member(s, s__parent, s_parent);
    if (parent == NULL)
        return FAIL;
    r = PyObject_IsTrue(parent);
    if (r > 0 && !(r = put_byte(b, ',')) && !(r = put_jid(b, JFIELD("parentSpanId"), parent, 1, s_span_id, 8)))
        r = (*remote = context_is_remote(parent)) < 0 ? FAIL : OK;
    Py_DECREF(parent);
    PyObject *name = r ? NULL : member(s, s__name, s_name);
    if (name == NULL)
        return r < 0 ? FAIL : r ? r : FAIL;
    r = put_jstring(b, JFIELD("name"), name, &first);
    Py_DECREF(name);
    int kind = r ? 0 : kind_number(s);
    if (r || kind <= 0)
        return r ? r : kind < 0 ? FAIL : SLOW;
    if (PUTS(b, ",\"kind\":") || put_decimal(b, (uint64_t)kind, 0))
        return FAIL;
    PyObject *start = member(s, s__start_time, s_start_time), *end = start ? member(s, s__end_time, s_end_time) : NULL;
    r = end == NULL ? FAIL : put_jtime(b, JFIELD("startTimeUnixNano"), start, &first);
    if (!r)
        r = put_jtime(b, JFIELD("endTimeUnixNano"), end, &first);
    Py_XDECREF(start);
    Py_XDECREF(end);
    return r;
}

static int put_jspan(Buf *b, const Span *s)
{
    int remote = 0, own, first = 0, r = FAIL;
    PyObject *context = span_context(s);
    if (context != NULL) {
        r = context == Py_None ? SLOW : put_jhead(b, s, context, &remote);
        Py_DECREF(context);
    }
    PyObject *attributes = r ? NULL : own_member(s, s__attributes, s_attributes, &own);
    if (attributes == NULL)
        return r ? r : FAIL;
    int plain = drops_nothing(attributes, own);
    r = put_jattributes(b, attributes, &first);
    Py_DECREF(attributes);
    if (r || (!plain && (r = put_jcount(b, JFIELD("droppedAttributesCount"), s->span, s_dropped_attributes, &first)))
        || (r = put_jlist(b, s, s__events, s_events, JFIELD("events"), s_dropped_events, JFIELD("droppedEventsCount"),
                          put_jevent))
        || (r = put_jlist(b, s, s__links, s_links, JFIELD("links"), s_dropped_links, JFIELD("droppedLinksCount"),
                          put_jlink)))
        return r;
    PyObject *status = member(s, s__status, s_status);
    if (status == NULL)
        return FAIL;
    r = status == Py_None ? OK : put_jstatus(b, status);
    Py_DECREF(status);
    return r || put_jflags(b, remote) ? (r ? r : FAIL) : put_byte(b, '}');
}

/* ---- the request (_scope, _resource, _encode) ---- */

static int join(Buf *group, const Buf *span)
{
    return (group->len && put_byte(group, ',')) || put(group, span->data, span->len) ? FAIL : OK;
}

static int put_jscope_spans(Buf *b, Group *c)
{
    int first = 1, r = OK;
    if (PUTS(b, "{\"scope\":{"))
        return FAIL;
    if (c->scope != Py_None
        && ((r = put_jstring_attr(b, JFIELD("name"), c->scope, s_name, &first))
            || (r = put_jstring_attr(b, JFIELD("version"), c->scope, s_version, &first))
            || (r = put_jattributes_attr(b, c->scope, &first))))
        return r;
    if (PUTS(b, "},\"spans\":[") || put(b, c->spans.data, c->spans.len) || put_byte(b, ']'))
        return FAIL;
    first = 0;
    if (c->scope != Py_None && (r = put_jstring_attr(b, JFIELD("schemaUrl"), c->scope, s_schema_url, &first)))
        return r;
    return put_byte(b, '}');
}

/* ResourceSpans.resource: {"resource":{"attributes":[...]}} */
static int put_jresource(Buf *b, PyObject *resource)
{
    int inner = 1, r;
    if (PUTS(b, "{\"resource\":{"))
        return FAIL;
    if ((r = put_jattributes_attr(b, resource, &inner)))
        return r;
    return put_byte(b, '}');
}

static int put_jrequest(Buf *b, Groups *g)
{
    PyObject *resource, *indexes;
    Py_ssize_t pos = 0;
    int r = OK, first = 1;
    if (PyDict_GET_SIZE(g->resources) == 0)
        return PUTS(b, "{}");
    if (PUTS(b, "{\"resourceSpans\":["))
        return FAIL;
    while (PyDict_Next(g->resources, &pos, &resource, &indexes)) { /* insertion order: first appearance */
        Group *head = group_at(g, indexes, 0);
        int inner = 0;
        if (comma(b, &first))
            return FAIL;
        if ((r = put_kept(b, head->resource, s__oe_json, put_jresource)))
            return r;
        if (PUTS(b, ",\"scopeSpans\":["))
            return FAIL;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(indexes); i++)
            if ((i && put_byte(b, ',')) || (r = put_jscope_spans(b, group_at(g, indexes, i))))
                return r ? r : FAIL;
        if (put_byte(b, ']') || (r = put_jstring_attr(b, JFIELD("schemaUrl"), head->resource, s_schema_url, &inner))
            || put_byte(b, '}'))
            return r ? r : FAIL;
    }
    return PUTS(b, "]}");
}

const Format JSON = {put_jspan, put_jrecord, join, put_jrequest};
