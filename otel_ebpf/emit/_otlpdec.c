/* otel_ebpf.emit._otlpdec: the bytes of an OTLP ExportTraceServiceRequest -> the SDK's ReadableSpans, in C.
 *
 * The same spans as otel_ebpf/emit/otlp_in.py's spans_from_request builds from the parsed request, function for
 * function (_resource, _scope, _span, _links, _id, _is_remote, decode_attributes, _value; opentelemetry-proto
 * 1.45's trace.proto and common.proto for the fields): a Resource per ResourceSpans and an InstrumentationScope
 * per ScopeSpans made by their own constructors (one object for all of the same bytes: Cache), each span's fields
 * written as ReadableSpan.__init__ writes them (the way otel_ebpf.emit.spans.SpanBuilder writes them), its
 * SpanContexts as SpanContext.__new__ makes them, every context SAMPLED, Events, Links and an ERROR Status with a
 * message made by their constructors, and its Span message as received in "_otlp_span" (as otlp_in._span keeps
 * it: unless a key came twice or a link was left out) for the encoders to send on. A span whose ids are not 16 and
 * 8 non-zero bytes is left out and counted (malformed_span), a link likewise (malformed_link). Equal immutable values
 * are shared where a request repeats them (strings, ints, the trace id and the parent SpanContext of a run of spans of
 * one trace, also interleaved with a few others: see cached_text, cached_int, trace_id_of, parent_context): ~17 -> ~10
 * objects made a rank span.
 *
 * decode_spans(data) returns (spans, malformed spans, malformed links), or None for a request off its fast path:
 * a trace state, a singular message field given twice (protobuf merges them), an AnyValue with more than one
 * member, values nested deeper than 32, a wire type it does not read, bytes that end inside a field, a string that
 * is not UTF-8 (every status message is read for it, used or not), a resource with entity_refs (strings it does not
 * read). So what it decodes, the parse would have accepted: the gateway decodes requests before any parse. The
 * caller then converts the parsed request in Python. Only MemoryError propagates.
 *
 * setup(ReadableSpan, SpanContext, Resource, InstrumentationScope, Event, Link, kinds, statuses, Status, ERROR,
 * SAMPLED, DEFAULT_TRACE_STATE) is called once by otlp_in.py: the classes, the SpanKind of each of the proto's kind
 * numbers 0..5, the Status objects of codes 0..2 without a message, the Status class and StatusCode.ERROR (for an
 * ERROR with a message), TraceFlags SAMPLED and the API's DEFAULT_TRACE_STATE.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { OK = 0, SLOW = 1, FAIL = -1 };
#define MAX_DEPTH 32

static PyObject *readable_span, *span_context, *resource_cls, *scope_cls, *event_cls, *link_cls, *kinds[6],
    *statuses[3], *error_code, *status_cls, *sampled, *default_state;
static PyObject *k_name, *k_context, *k_kind, *k_info, *k_scope, *k_parent, *k_start, *k_end, *k_attributes,
    *k_events, *k_links, *k_resource, *k_status, *k_otlp_span, *empty, *no_args;

typedef struct {
    const unsigned char *p, *end;
} Rd;

typedef struct {
    Py_ssize_t malformed_spans, malformed_links;
} Counts;

/* The readers below are called for every field of every span: inlined, with the one-byte varint (every tag and
 * length under 128 in a rank span) taken first (perf on bench/gateway.py's spans: tag and delimited were 14 % of
 * the decode as calls). */
#define HOT static inline __attribute__((always_inline))

HOT int varint(Rd *r, uint64_t *v)
{
    if (r->p < r->end && !(*r->p & 0x80)) {
        *v = *r->p++;
        return OK;
    }
    uint64_t out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end)
            return SLOW;
        unsigned char c = *r->p++;
        out |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = out;
            return OK;
        }
    }
    return SLOW;
}

HOT int fixed(Rd *r, int size, uint64_t *v)
{
    if (r->end - r->p < size)
        return SLOW;
    uint64_t out = 0;
    for (int i = size - 1; i >= 0; i--)
        out = out << 8 | r->p[i];
    r->p += size;
    *v = out;
    return OK;
}

/* The next field's number and wire type; 0 at the end. */
HOT int tag(Rd *r, uint32_t *field, int *wire)
{
    if (r->p >= r->end) {
        *field = 0;
        return OK;
    }
    uint64_t t;
    if (varint(r, &t) || (t >> 3) == 0 || (t >> 3) > UINT32_MAX)
        return SLOW;
    *field = (uint32_t)(t >> 3);
    *wire = (int)(t & 7);
    return OK;
}

HOT int delimited(Rd *r, Rd *sub)
{
    uint64_t n;
    if (varint(r, &n) || n > (uint64_t)(r->end - r->p))
        return SLOW;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return OK;
}

static int skip(Rd *r, int wire)
{
    uint64_t v;
    Rd sub;
    switch (wire) {
    case 0: return varint(r, &v);
    case 1: return fixed(r, 8, &v);
    case 2: return delimited(r, &sub);
    case 5: return fixed(r, 4, &v);
    default: return SLOW; /* groups */
    }
}

/* A length-delimited field as a str (NULL and SLOW for bad UTF-8, as the parse would have refused it). */
static PyObject *text(Rd *sub, int *r)
{
    PyObject *s = PyUnicode_DecodeUTF8((const char *)sub->p, sub->end - sub->p, NULL);
    if (s == NULL) {
        *r = PyErr_ExceptionMatches(PyExc_UnicodeDecodeError) ? SLOW : FAIL;
        if (*r == SLOW)
            PyErr_Clear();
    }
    return s;
}

/* Short strings seen before (attribute keys, span names, repeated values: every rank span carries the same keys):
 * a direct-mapped table of TEXT_SLOTS str objects, looked up by the bytes' hash and compared byte for byte, so a
 * repeated string is one reference instead of a decode and a new object (whose hash a dict insert computes again).
 * Bounded by its size; a slot is simply replaced. Used under the GIL only. */
#define TEXT_SLOTS 1024
#define TEXT_MAX 64
static PyObject *texts[TEXT_SLOTS];

static PyObject *cached_text(Rd *sub, int *r)
{
    size_t n = (size_t)(sub->end - sub->p);
    if (n > TEXT_MAX)
        return text(sub, r);
    uint64_t h = n * 0x9E3779B97F4A7C15ull; /* 8 bytes a step (FNV-1a a byte a step was 13 % of the decode) */
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, sub->p + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, sub->p + i, n - i);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    h ^= h >> 29;
    PyObject **slot = &texts[h & (TEXT_SLOTS - 1)];
    if (*slot != NULL && PyUnicode_IS_COMPACT_ASCII(*slot) && (size_t)PyUnicode_GET_LENGTH(*slot) == n
        && memcmp(PyUnicode_DATA(*slot), sub->p, n) == 0)
        return Py_NewRef(*slot);
    PyObject *s = text(sub, r);
    if (s != NULL && PyUnicode_IS_COMPACT_ASCII(s))
        Py_XSETREF(*slot, Py_NewRef(s));
    return s;
}

/* Ints past CPython's own small ints (-5..256) that come again span after span (nccl.count, nccl.bytes,
 * nccl.nranks, thread.id, a rank over 256): a direct-mapped table of INT_SLOTS int objects, looked up by value, so a
 * repeated value is one reference instead of a new object to make, hold and free. An int never changes, so a shared
 * one is the same to every reader. Bounded by its size (4,096 ints, ~200 KiB with the table: 1,024 ranks' own ranks
 * and thread ids are ~2,000 values; 512 slots mostly missed there); a slot is simply replaced. Used under the GIL
 * only. */
#define INT_SLOTS 4096
static PyObject *ints[INT_SLOTS];
static int64_t int_values[INT_SLOTS];

static PyObject *cached_int(int64_t v)
{
    if (v >= -5 && v <= 256)
        return PyLong_FromLongLong(v);
    size_t i = (size_t)(((uint64_t)v * 0x9E3779B97F4A7C15ull) >> 52); /* the top 12 bits: INT_SLOTS */
    if (ints[i] != NULL && int_values[i] == v)
        return Py_NewRef(ints[i]);
    PyObject *o = PyLong_FromLongLong(v);
    if (o != NULL) {
        Py_XSETREF(ints[i], Py_NewRef(o));
        int_values[i] = v;
    }
    return o;
}

static int key_values(Rd r, PyObject *dict, int depth);

/* One AnyValue message as otlp_in._value reads it (a new reference), or NULL with *r SLOW/FAIL. */
static PyObject *any_value(Rd r, int depth, int *st)
{
    uint32_t field;
    int wire, members = 0;
    PyObject *out = NULL;
    if (depth > MAX_DEPTH) {
        *st = SLOW;
        return NULL;
    }
    for (;;) {
        if ((*st = tag(&r, &field, &wire)))
            goto fail;
        if (field == 0)
            break;
        if (field > 7) {
            if ((*st = skip(&r, wire)))
                goto fail;
            continue;
        }
        if (++members > 1) { /* the parse keeps the last member, merging messages: Python's path */
            *st = SLOW;
            goto fail;
        }
        uint64_t v = 0;
        Rd sub;
        int want = field == 2 || field == 3 ? 0 : field == 4 ? 1 : 2;
        if (wire != want) {
            *st = SLOW;
            goto fail;
        }
        if ((*st = want == 0 ? varint(&r, &v) : want == 1 ? fixed(&r, 8, &v) : delimited(&r, &sub)))
            goto fail;
        switch (field) {
        case 1: out = cached_text(&sub, st); break;
        case 2: out = PyBool_FromLong(v != 0); break;
        case 3: out = cached_int((int64_t)v); break;
        case 4: { double d; memcpy(&d, &v, sizeof d); out = PyFloat_FromDouble(d); break; }
        case 5: {
            PyObject *items = PyList_New(0);
            uint32_t f;
            int w;
            Rd arr = sub, one;
            while (items != NULL) {
                if ((*st = tag(&arr, &f, &w)) || f == 0)
                    break;
                if (f != 1 || w != 2) {
                    if ((*st = f == 1 ? SLOW : skip(&arr, w)))
                        break;
                    continue;
                }
                if ((*st = delimited(&arr, &one)))
                    break;
                PyObject *item = any_value(one, depth + 1, st);
                if (item == NULL || PyList_Append(items, item) < 0) {
                    Py_XDECREF(item);
                    if (*st == OK)
                        *st = FAIL;
                    break;
                }
                Py_DECREF(item);
            }
            out = items != NULL && *st == OK ? PyList_AsTuple(items) : NULL;
            if (items == NULL)
                *st = FAIL;
            Py_XDECREF(items);
            break;
        }
        case 6:
            out = PyDict_New();
            if (out != NULL && (*st = key_values(sub, out, depth + 1)))
                Py_CLEAR(out);
            break;
        case 7: out = PyBytes_FromStringAndSize((const char *)sub.p, sub.end - sub.p); break;
        }
        if (out == NULL) {
            if (*st == OK)
                *st = FAIL;
            goto fail;
        }
    }
    *st = OK;
    return out != NULL ? out : Py_NewRef(Py_None);
fail:
    Py_XDECREF(out);
    return NULL;
}

/* One KeyValue message into dict (later keys win, as decode_attributes' dict). */
static int key_value(Rd r, PyObject *dict, int depth)
{
    uint32_t field;
    int wire, st, values = 0;
    PyObject *key = NULL, *value = NULL;
    for (;;) {
        if ((st = tag(&r, &field, &wire)))
            goto out;
        if (field == 0)
            break;
        Rd sub;
        if ((field == 1 || field == 2) && wire == 2) {
            if ((st = delimited(&r, &sub)))
                goto out;
            if (field == 1) {
                Py_XDECREF(key);
                if ((key = cached_text(&sub, &st)) == NULL)
                    goto out;
            } else {
                if (++values > 1) { /* a message field twice: the parse merges them */
                    st = SLOW;
                    goto out;
                }
                if ((value = any_value(sub, depth, &st)) == NULL)
                    goto out;
            }
        } else if ((st = field <= 2 ? SLOW : skip(&r, wire))) {
            goto out;
        }
    }
    if (key == NULL && (key = PyUnicode_FromStringAndSize("", 0)) == NULL) {
        st = FAIL;
        goto out;
    }
    st = PyDict_SetItem(dict, key, value != NULL ? value : Py_None) < 0 ? FAIL : OK;
out:
    Py_XDECREF(key);
    Py_XDECREF(value);
    return st;
}

/* Every KeyValue of field ``field`` of a message (attributes: field 1 of KeyValueList, 9 of Span...). */
static int attributes_of(Rd r, uint32_t want, PyObject *dict, int depth)
{
    uint32_t field;
    int wire, st;
    for (;;) {
        if ((st = tag(&r, &field, &wire)) || field == 0)
            return st;
        Rd sub;
        if (field == want && wire == 2) {
            if ((st = delimited(&r, &sub)) || (st = key_value(sub, dict, depth)))
                return st;
        } else if ((st = skip(&r, wire))) {
            return st;
        }
    }
}

static int key_values(Rd r, PyObject *dict, int depth)
{
    return attributes_of(r, 1, dict, depth);
}

/* ---- spans (otlp_in._id, _is_remote, _links, _span) ---- */

/* An id of ``size`` non-zero bytes as an int, or NULL with *bad set (no error) or an error set. */
static PyObject *id_of(Rd sub, Py_ssize_t size, int *bad)
{
    *bad = 0;
    if (sub.end - sub.p != size) {
        *bad = 1;
        return NULL;
    }
    int zero = 1;
    for (Py_ssize_t i = 0; i < size; i++)
        zero &= sub.p[i] == 0;
    if (zero) {
        *bad = 1;
        return NULL;
    }
    return _PyLong_FromByteArray(sub.p, (size_t)size, 0, 0);
}

/* The trace ids and parent SpanContexts made lately (what a request's spans share: the ranks of one collective are
 * one trace under one root, an agent sends its ranks' spans of a collective together, and the collectives of a few
 * communicators in flight come interleaved), each kept with the bytes it was made from, the last ID_SLOTS of each: a
 * span with the same bytes gets the same object (ints and SpanContexts never change), three objects fewer to make,
 * hold and free. Looked up newest first (a run of one trace hits at once); the oldest is replaced. Used under the GIL
 * only. */
#define ID_SLOTS 16
typedef struct {
    unsigned char keys[ID_SLOTS][8 + 16 + 1];
    PyObject *objs[ID_SLOTS];
    unsigned next; /* the slot to fill next: the newest is the one before it */
} Recent;
static Recent recent_tids, recent_parents;

/* The object kept for the ``n`` bytes at ``key``, a new reference, or NULL. */
static PyObject *recent_get(Recent *c, const unsigned char *key, size_t n)
{
    for (unsigned k = 1; k <= ID_SLOTS; k++) {
        unsigned i = (c->next - k) % ID_SLOTS;
        if (c->objs[i] == NULL)
            return NULL; /* filled in order: none older */
        if (memcmp(c->keys[i], key, n) == 0)
            return Py_NewRef(c->objs[i]);
    }
    return NULL;
}

static void recent_put(Recent *c, const unsigned char *key, size_t n, PyObject *obj)
{
    unsigned i = c->next; /* always < ID_SLOTS */
    memcpy(c->keys[i], key, n);
    Py_XSETREF(c->objs[i], Py_NewRef(obj));
    c->next = (i + 1) % ID_SLOTS;
}

/* id_of(sub, 16, bad), the same int object as one made lately from the same bytes. */
static PyObject *trace_id_of(Rd sub, int *bad)
{
    PyObject *tid = sub.end - sub.p == 16 ? recent_get(&recent_tids, sub.p, 16) : NULL;
    if (tid != NULL) {
        *bad = 0;
        return tid;
    }
    tid = id_of(sub, 16, bad);
    if (tid != NULL) /* 16 bytes: id_of took them */
        recent_put(&recent_tids, sub.p, 16, tid);
    return tid;
}

static int is_remote(uint64_t flags)
{
    return (flags & 0x100) && (flags & 0x200); /* SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, _IS_REMOTE_MASK */
}

/* SpanContext(trace_id, span_id, is_remote, SAMPLED) as SpanContext.__new__ makes it (ids non-zero: valid): what
 * tuple.__new__(SpanContext, items) makes, the tuple subclass's own allocation filled in place. */
static PyObject *context(PyObject *trace_id, PyObject *span_id, int remote)
{
    PyTypeObject *type = (PyTypeObject *)span_context;
    PyObject *out = type->tp_alloc(type, 6);
    if (out == NULL)
        return NULL;
    PyObject *items[6] = {trace_id, span_id, remote ? Py_True : Py_False, sampled, default_state, Py_True};
    for (Py_ssize_t i = 0; i < 6; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(items[i]));
    return out;
}

/* context(tid, parent id, remote) for ``parent``'s 8 bytes in trace ``trace`` (16 bytes), the same object as one
 * made lately from the same bytes and remote flag; NULL for a bad id (*bad) or an error. */
static PyObject *parent_context(Rd trace, Rd parent, PyObject *tid, int remote, int *bad)
{
    unsigned char key[8 + 16 + 1];
    *bad = 0;
    if (parent.end - parent.p == 8) {
        memcpy(key, parent.p, 8);
        memcpy(key + 8, trace.p, 16);
        key[24] = (unsigned char)remote;
        PyObject *ctx = recent_get(&recent_parents, key, sizeof key);
        if (ctx != NULL)
            return ctx;
    }
    PyObject *pid = id_of(parent, 8, bad), *ctx = pid == NULL ? NULL : context(tid, pid, remote);
    Py_XDECREF(pid);
    if (ctx != NULL) /* 8 bytes: id_of took them */
        recent_put(&recent_parents, key, sizeof key, ctx);
    return ctx;
}

static PyObject *call2(PyObject *cls, PyObject *a, PyObject *b)
{
    return PyObject_CallFunctionObjArgs(cls, a, b, NULL);
}

/* Event(name, attributes, time_unix_nano), as _span makes it. */
static PyObject *event_of(Rd r, int *st)
{
    uint32_t field;
    int wire;
    uint64_t time_ns = 0;
    PyObject *name = NULL, *attrs = PyDict_New(), *out = NULL;
    if (attrs == NULL) {
        *st = FAIL;
        return NULL;
    }
    for (;;) {
        if ((*st = tag(&r, &field, &wire)))
            goto done;
        if (field == 0)
            break;
        Rd sub;
        if (field == 1 && wire == 1) {
            *st = fixed(&r, 8, &time_ns);
        } else if (field == 2 && wire == 2) {
            if (!(*st = delimited(&r, &sub))) {
                Py_XDECREF(name);
                name = text(&sub, st);
            }
        } else if (field == 3 && wire == 2) {
            if (!(*st = delimited(&r, &sub)))
                *st = key_value(sub, attrs, 0);
        } else {
            *st = field <= 3 ? SLOW : skip(&r, wire);
        }
        if (*st)
            goto done;
    }
    if (name == NULL && (name = PyUnicode_FromStringAndSize("", 0)) == NULL) {
        *st = FAIL;
        goto done;
    }
    PyObject *t = PyLong_FromUnsignedLongLong(time_ns);
    out = t == NULL ? NULL : PyObject_CallFunctionObjArgs(event_cls, name, attrs, t, NULL);
    Py_XDECREF(t);
    *st = out == NULL ? FAIL : OK;
done:
    Py_XDECREF(name);
    Py_DECREF(attrs);
    return out;
}

/* Link(SpanContext(...), attributes) as _links makes it; NULL with *st OK for a malformed link (counted). */
static PyObject *link_of(Rd r, Counts *counts, int *st)
{
    uint32_t field;
    int wire, bad = 0;
    uint64_t flags = 0;
    Rd trace = {NULL, NULL}, span = {NULL, NULL}, all = r, sub;
    for (;;) {
        if ((*st = tag(&r, &field, &wire)))
            return NULL;
        if (field == 0)
            break;
        if ((field == 1 || field == 2 || field == 3) && wire == 2) {
            if ((*st = delimited(&r, &sub)))
                return NULL;
            if (field == 3 && sub.p != sub.end) { /* a trace state: TraceState.from_header, Python's path */
                *st = SLOW;
                return NULL;
            }
            if (field == 1)
                trace = sub;
            else if (field == 2)
                span = sub;
        } else if (field == 6 && wire == 5) {
            if ((*st = fixed(&r, 4, &flags)))
                return NULL;
        } else if ((*st = field <= 3 || field == 6 ? SLOW : skip(&r, wire))) {
            return NULL;
        }
    }
    PyObject *tid = id_of(trace, 16, &bad), *sid = tid == NULL ? NULL : id_of(span, 8, &bad);
    if (sid == NULL) {
        Py_XDECREF(tid);
        *st = bad ? OK : FAIL;
        counts->malformed_links += bad;
        return NULL;
    }
    PyObject *ctx = context(tid, sid, is_remote(flags)), *attrs = ctx == NULL ? NULL : PyDict_New(), *out = NULL;
    Py_DECREF(tid);
    Py_DECREF(sid);
    *st = attrs == NULL ? FAIL : attributes_of(all, 4, attrs, 0);
    if (*st == OK) {
        out = call2(link_cls, ctx, attrs);
        *st = out == NULL ? FAIL : OK;
    }
    Py_XDECREF(ctx);
    Py_XDECREF(attrs);
    return out;
}

/* Status(code, message if ERROR and message else None), as _span makes it. */
static PyObject *status_of(Rd r, int *st)
{
    uint32_t field;
    int wire;
    uint64_t code = 0;
    Rd message = {NULL, NULL};
    for (;;) {
        if ((*st = tag(&r, &field, &wire)))
            return NULL;
        if (field == 0)
            break;
        if (field == 2 && wire == 2)
            *st = delimited(&r, &message);
        else if (field == 3 && wire == 0)
            *st = varint(&r, &code);
        else
            *st = field == 2 || field == 3 ? SLOW : skip(&r, wire);
        if (*st)
            return NULL;
    }
    uint32_t c = (uint32_t)code; /* the parse keeps an enum's low 32 bits */
    if (c > 2)                    /* outside 0..2: UNSET, as _STATUS.get */
        c = 0;
    if (message.p == message.end)
        return Py_NewRef(statuses[c]);
    PyObject *msg = text(&message, st); /* read even when unused: UTF-8 or the parse would refuse the request */
    if (msg == NULL)
        return NULL;
    if (c != 2) {
        Py_DECREF(msg);
        return Py_NewRef(statuses[c]);
    }
    PyObject *out = call2(status_cls, error_code, msg);
    Py_DECREF(msg);
    *st = out == NULL ? FAIL : OK;
    return out;
}

typedef struct {
    Rd trace, span, parent, status;
    int has_status;
    uint64_t kind, start, end, flags;
    PyObject *name;
} Head;

/* Pass 1 over a Span: its scalar fields (the last of each, as the parse keeps). */
static int span_head(Rd r, Head *h)
{
    uint32_t field;
    int wire, st;
    for (;;) {
        if ((st = tag(&r, &field, &wire)))
            return st;
        if (field == 0)
            return OK;
        Rd sub;
        if (wire == 2 && field <= 5) {
            if ((st = delimited(&r, &sub)))
                return st;
            if (field == 1)
                h->trace = sub;
            else if (field == 2)
                h->span = sub;
            else if (field == 3 && sub.p != sub.end)
                return SLOW; /* a trace state: TraceState.from_header, Python's path */
            else if (field == 4)
                h->parent = sub;
            else if (field == 5) {
                Py_XSETREF(h->name, cached_text(&sub, &st));
                if (h->name == NULL)
                    return st;
            }
        } else if (field == 15 && wire == 2) {
            if (h->has_status++ || (st = delimited(&r, &h->status)))
                return h->has_status > 1 ? SLOW : st;
        } else if (field == 6 && wire == 0) {
            if ((st = varint(&r, &h->kind)))
                return st;
        } else if ((field == 7 || field == 8) && wire == 1) {
            if ((st = fixed(&r, 8, field == 7 ? &h->start : &h->end)))
                return st;
        } else if (field == 16 && wire == 5) {
            if ((st = fixed(&r, 4, &h->flags)))
                return st;
        } else if (field == 9 || field == 11 || field == 13) { /* attributes, events, links: pass 2 */
            if (wire != 2 || (st = delimited(&r, &sub)))
                return wire != 2 ? SLOW : st;
        } else if (field <= 16 && field != 10 && field != 12 && field != 14) {
            return SLOW; /* a known field with another wire type */
        } else if ((st = skip(&r, wire))) {
            return st; /* the dropped counts (10, 12, 14: the SDK derives its own), unknown fields */
        }
    }
}

/* Pass 2: attributes (9), events (11), links (13) in wire order. */
/* The span's attributes into ``attrs``, its events and links each into a list made at its first (``*events``,
 * ``*links``: NULL while there is none). */
static int span_lists(Rd r, PyObject *attrs, PyObject **events, PyObject **links, Counts *counts, Py_ssize_t *kvs)
{
    uint32_t field;
    int wire, st;
    for (;;) {
        if ((st = tag(&r, &field, &wire)))
            return st;
        if (field == 0)
            return OK;
        Rd sub;
        if (!(field == 9 || field == 11 || field == 13)) {
            if ((st = skip(&r, wire)))
                return st;
            continue;
        }
        if ((st = delimited(&r, &sub)))
            return st;
        if (field == 9) {
            ++*kvs;
            if ((st = key_value(sub, attrs, 0)))
                return st;
            continue;
        }
        PyObject *item = field == 11 ? event_of(sub, &st) : link_of(sub, counts, &st);
        if (item == NULL) {
            if (st)
                return st;
            continue; /* a malformed link, counted */
        }
        PyObject **list = field == 11 ? events : links;
        if (*list == NULL && (*list = PyList_New(0)) == NULL) {
            Py_DECREF(item);
            return FAIL;
        }
        st = PyList_Append(*list, item) < 0 ? FAIL : OK;
        Py_DECREF(item);
        if (st)
            return st;
    }
}

static int set(PyObject *o, PyObject *k, PyObject *v)
{
    return PyObject_GenericSetAttr(o, k, v) < 0 ? FAIL : OK;
}

/* One Span as _span builds it, appended to ``out``; a malformed one is counted instead. */
static int span_of(Rd r, PyObject *resource, PyObject *scope, PyObject *out, Counts *counts)
{
    Head h = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}, {NULL, NULL}, 0, 0, 0, 0, 0, NULL};
    int st = span_head(r, &h), bad = 0;
    PyObject *tid = NULL, *sid = NULL, *pctx = NULL, *span = NULL, *v = NULL;
    if (st)
        goto done;
    tid = trace_id_of(h.trace, &bad); /* 16 bytes when not NULL: parent_context reads them */
    sid = tid == NULL ? NULL : id_of(h.span, 8, &bad);
    pctx = sid == NULL || h.parent.p == h.parent.end ? NULL
                                                     : parent_context(h.trace, h.parent, tid, is_remote(h.flags), &bad);
    if (sid == NULL || (pctx == NULL && h.parent.p != h.parent.end)) {
        st = bad ? OK : FAIL;
        counts->malformed_spans += bad;
        goto done;
    }
    /* no events or no links: the empty tuple, ReadableSpan's own default, not an empty list each (two objects fewer
     * to make and free a span: rank spans have neither) */
    PyObject *events = NULL, *links = NULL, *attrs = PyDict_New();
    /* made as object.__new__(ReadableSpan) makes it, its fields set one by one as ReadableSpan.__init__ sets
     * them: on CPython 3.11+ they are kept in the instance's own value array, keyed by the class's shared keys,
     * where a __dict__ of its own (PyObject_GenericSetDict) took a dict grown in two resizes, ~320 bytes more a
     * held span; an encoder reading __dict__ gets a dict made then over the same values */
    span = ((PyTypeObject *)readable_span)->tp_new((PyTypeObject *)readable_span, no_args, NULL);
    if (attrs == NULL || span == NULL) {
        Py_XDECREF(attrs);
        st = FAIL;
        goto done;
    }
    /* ReadableSpan.__init__'s fields, in its order (otel_ebpf.emit.spans.SpanBuilder writes the same) */
    uint32_t kind = (uint32_t)h.kind;
    if (!(st = set(span, k_name, h.name != NULL ? h.name : empty))) {
        v = context(tid, sid, 0);
        st = v == NULL ? FAIL : set(span, k_context, v);
        Py_CLEAR(v);
    }
    if (!st && !(st = set(span, k_kind, kinds[kind <= 5 ? kind : 1])) && !(st = set(span, k_info, Py_None))
        && !(st = set(span, k_scope, scope))) {
        st = set(span, k_parent, pctx == NULL ? Py_None : pctx);
    }
    if (!st) {
        v = PyLong_FromUnsignedLongLong(h.start);
        st = v == NULL ? FAIL : set(span, k_start, v);
        Py_CLEAR(v);
    }
    if (!st) {
        v = PyLong_FromUnsignedLongLong(h.end);
        st = v == NULL ? FAIL : set(span, k_end, v);
        Py_CLEAR(v);
    }
    Py_ssize_t kvs = 0, bad_links = counts->malformed_links;
    if (!st)
        st = span_lists(r, attrs, &events, &links, counts, &kvs);
    if (!st && !(st = set(span, k_attributes, attrs)) && !(st = set(span, k_events, events ? events : no_args))
        && !(st = set(span, k_links, links ? links : no_args)) && !(st = set(span, k_resource, resource))) {
        v = h.has_status ? status_of(h.status, &st) : Py_NewRef(statuses[0]);
        if (v != NULL)
            st = set(span, k_status, v);
        else if (!st)
            st = FAIL;
        Py_CLEAR(v);
    }
    /* the bytes as received, for the encoder to send on (otlp_in's _received): unless a key came twice or a link
     * was left out, where they would say more than the span does */
    if (!st && kvs == PyDict_GET_SIZE(attrs) && counts->malformed_links == bad_links) {
        v = PyBytes_FromStringAndSize((const char *)r.p, r.end - r.p);
        st = v == NULL ? FAIL : set(span, k_otlp_span, v);
        Py_CLEAR(v);
    }
    Py_XDECREF(events);
    Py_XDECREF(links);
    Py_DECREF(attrs);
    if (!st && PyList_Append(out, span) < 0)
        st = FAIL;
done:
    Py_XDECREF(h.name);
    Py_XDECREF(tid);
    Py_XDECREF(sid);
    Py_XDECREF(pctx);
    Py_XDECREF(span);
    return st;
}

/* ---- the request (otlp_in._resource, _scope, spans_from_request) ---- */

/* Pass 1 over a ResourceSpans or ScopeSpans: its one message field 1 (NULL reader when absent) and schema URL
 * (field 3), which the object made from field 1 needs before any span is read. */
static int head_of(Rd r, Rd *first, PyObject **schema)
{
    uint32_t field;
    int wire, st, seen = 0;
    first->p = first->end = NULL;
    for (;;) {
        if ((st = tag(&r, &field, &wire)))
            return st;
        if (field == 0)
            return OK;
        Rd sub;
        if ((field == 1 || field == 3) && wire == 2) {
            if ((st = delimited(&r, &sub)))
                return st;
            if (field == 1) {
                if (seen++)
                    return SLOW; /* a message field twice: the parse merges them */
                *first = sub;
            } else {
                Py_XSETREF(*schema, text(&sub, &st));
                if (*schema == NULL)
                    return st;
            }
        } else if ((st = field == 1 || field == 3 ? SLOW : skip(&r, wire))) {
            return st;
        }
    }
}

/* Each field-2 message of r (scope_spans of a ResourceSpans, spans of a ScopeSpans) to one(sub, ...). */
static int each_second(Rd r, int (*one)(Rd, PyObject *, PyObject *, PyObject *, Counts *), PyObject *a,
                       PyObject *b, PyObject *out, Counts *counts)
{
    uint32_t field;
    int wire, st;
    for (;;) {
        if ((st = tag(&r, &field, &wire)) || field == 0)
            return st;
        Rd sub;
        if (field == 2 && wire == 2) {
            if ((st = delimited(&r, &sub)) || (st = one(sub, a, b, out, counts)))
                return st;
        } else if ((st = field == 2 ? SLOW : skip(&r, wire))) {
            return st;
        }
    }
}

/* The Resources and InstrumentationScopes made so far, by their bytes: the message's length (4 bytes), its bytes
 * and the schema URL. Agents send the same few resources (one a process) and scopes in every request; made anew
 * per request, a Resource cost its constructor (~2 us) and, in every batch the gateway encodes, a hash of its own
 * (the SDK's Resource.__hash__ JSON-dumps the attributes; otlp_in.ReceivedResource keeps it), and a scope its
 * constructor (BoundedAttributes: ~5 % of the gateway's CPU): bench/gateway_wire.py under py-spy. Equal bytes
 * decode to equal objects, which are immutable, so one object serves them all. At most CACHE_MAX entries each: a
 * full cache is emptied (counted in its clears) and fills again. Held with the GIL, like every call here. */
#define CACHE_MAX 4096
typedef struct {
    PyObject *made; /* dict: key -> object */
    Py_ssize_t clears;
} Cache;
static Cache resources, scopes;

static PyObject *cache_key(Rd head, PyObject *schema)
{
    Py_ssize_t n = head.p != NULL ? (Py_ssize_t)(head.end - head.p) : 0, m = 0;
    const char *url = "";
    if (schema != NULL && (url = PyUnicode_AsUTF8AndSize(schema, &m)) == NULL)
        return NULL;
    if ((size_t)n > UINT32_MAX) { /* never from the server (max_request_bytes), but the length must fit */
        PyErr_SetString(PyExc_OverflowError, "a message over 4 GiB");
        return NULL;
    }
    PyObject *key = PyBytes_FromStringAndSize(NULL, 4 + n + m);
    if (key == NULL)
        return NULL;
    char *k = PyBytes_AS_STRING(key);
    uint32_t len = (uint32_t)n;
    memcpy(k, &len, 4);
    if (n)
        memcpy(k + 4, head.p, (size_t)n);
    if (m)
        memcpy(k + 4 + n, url, (size_t)m);
    return key;
}

/* The object cached under ``key`` (a new reference), or NULL: absent (no error set) or an error. */
static PyObject *cache_get(Cache *c, PyObject *key)
{
    PyObject *got = PyDict_GetItemWithError(c->made, key);
    return Py_XNewRef(got);
}

static int cache_put(Cache *c, PyObject *key, PyObject *value)
{
    if (PyDict_GET_SIZE(c->made) >= CACHE_MAX) {
        PyDict_Clear(c->made);
        c->clears++;
    }
    return PyDict_SetItem(c->made, key, value) < 0 ? FAIL : OK;
}

/* InstrumentationScope(name, version or None, schema_url or None, attributes or None) of a ScopeSpans. */
static PyObject *scope_of(Rd r, PyObject *schema, int *st)
{
    uint32_t field;
    int wire;
    PyObject *name = NULL, *version = NULL, *attrs = PyDict_New(), *out = NULL;
    if (attrs == NULL) {
        *st = FAIL;
        return NULL;
    }
    for (;;) {
        if ((*st = tag(&r, &field, &wire)))
            goto done;
        if (field == 0)
            break;
        Rd sub;
        if (field <= 3 && wire == 2) {
            if ((*st = delimited(&r, &sub)))
                goto done;
            if (field == 3) {
                *st = key_value(sub, attrs, 0);
            } else {
                PyObject **slot = field == 1 ? &name : &version;
                Py_XSETREF(*slot, text(&sub, st));
            }
        } else {
            *st = field <= 3 ? SLOW : skip(&r, wire);
        }
        if (*st)
            goto done;
    }
    out = PyObject_CallFunctionObjArgs(scope_cls, name != NULL ? name : empty,
                                       version != NULL && PyUnicode_GET_LENGTH(version) ? version : Py_None,
                                       schema != NULL && PyUnicode_GET_LENGTH(schema) ? schema : Py_None,
                                       PyDict_GET_SIZE(attrs) ? attrs : Py_None, NULL);
    *st = out == NULL ? FAIL : OK;
done:
    Py_XDECREF(name);
    Py_XDECREF(version);
    Py_DECREF(attrs);
    return out;
}

static int scope_spans(Rd r, PyObject *resource, PyObject *unused, PyObject *out, Counts *counts)
{
    (void)unused;
    Rd head;
    PyObject *schema = NULL, *scope = NULL;
    int st = head_of(r, &head, &schema);
    PyObject *key = st ? NULL : cache_key(head, schema);
    if (!st && key == NULL)
        st = FAIL;
    if (!st && (scope = cache_get(&scopes, key)) == NULL) {
        Rd none = {NULL, NULL};
        if (PyErr_Occurred())
            st = FAIL;
        else if ((scope = scope_of(head.p != NULL ? head : none, schema, &st)) != NULL)
            st = cache_put(&scopes, key, scope);
    }
    if (!st)
        st = each_second(r, span_of, resource, scope, out, counts);
    Py_XDECREF(key);
    Py_XDECREF(schema);
    Py_XDECREF(scope);
    return st;
}

/* Whether message r has field ``want``; SLOW for bytes that do not parse. */
static int has_field(Rd r, uint32_t want, int *found)
{
    uint32_t field;
    int wire, st;
    *found = 0;
    for (;;) {
        if ((st = tag(&r, &field, &wire)) || field == 0)
            return st;
        if (field == want) {
            *found = 1;
            return OK;
        }
        if ((st = skip(&r, wire)))
            return st;
    }
}

/* The Resource of a ResourceSpans (otlp_in._resource), made or from the cache; SLOW for one with entity_refs
 * (resource.proto field 3: strings this decoder does not read, so not check, and otlp_in does not keep). */
static PyObject *resource_of(Rd head, PyObject *schema, int *st)
{
    int refs = 0;
    if (head.p != NULL && ((*st = has_field(head, 3, &refs)) || refs)) {
        *st = *st ? *st : SLOW;
        return NULL;
    }
    PyObject *key = cache_key(head, schema), *resource = NULL, *attrs = NULL;
    if (key == NULL || (resource = cache_get(&resources, key)) != NULL || PyErr_Occurred()) {
        *st = resource != NULL ? OK : FAIL;
        Py_XDECREF(key);
        return resource;
    }
    if ((attrs = PyDict_New()) == NULL) {
        *st = FAIL;
    } else if (head.p == NULL || !(*st = attributes_of(head, 1, attrs, 0))) {
        resource = call2(resource_cls, attrs, schema != NULL && PyUnicode_GET_LENGTH(schema) ? schema : Py_None);
        *st = resource == NULL ? FAIL : cache_put(&resources, key, resource);
        if (*st)
            Py_CLEAR(resource);
    }
    Py_XDECREF(attrs);
    Py_DECREF(key);
    return resource;
}

static int resource_spans(Rd r, PyObject *unused1, PyObject *unused2, PyObject *out, Counts *counts)
{
    (void)unused1;
    (void)unused2;
    Rd head;
    PyObject *schema = NULL, *resource = NULL;
    int st = head_of(r, &head, &schema);
    if (!st)
        resource = resource_of(head, schema, &st);
    if (!st)
        st = each_second(r, scope_spans, resource, NULL, out, counts);
    Py_XDECREF(schema);
    Py_XDECREF(resource);
    return st;
}

static PyObject *cache_info(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("{s(nnn)s(nnn)}", "resources", PyDict_GET_SIZE(resources.made), (Py_ssize_t)CACHE_MAX,
                         resources.clears, "scopes", PyDict_GET_SIZE(scopes.made), (Py_ssize_t)CACHE_MAX,
                         scopes.clears);
}

static PyObject *decode_spans(PyObject *self, PyObject *arg)
{
    (void)self;
    if (readable_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlpdec.setup() was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Rd r = {view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *out = PyList_New(0);
    Counts counts = {0, 0};
    uint32_t field;
    int wire, st = out == NULL ? FAIL : OK;
    while (!st) {
        if ((st = tag(&r, &field, &wire)) || field == 0)
            break;
        Rd sub;
        if (field == 1 && wire == 2) {
            if (!(st = delimited(&r, &sub)))
                st = resource_spans(sub, NULL, NULL, out, &counts);
        } else {
            st = field == 1 ? SLOW : skip(&r, wire);
        }
    }
    PyBuffer_Release(&view);
    if (st == OK)
        return Py_BuildValue("(Nnn)", out, counts.malformed_spans, counts.malformed_links);
    Py_XDECREF(out);
    if (st == SLOW || !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear(); /* a constructor that raised: Python's path decides */
        Py_RETURN_NONE;
    }
    return NULL;
}

static PyObject *setup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *objs[12];
    if (!PyArg_UnpackTuple(args, "setup", 12, 12, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                           &objs[6], &objs[7], &objs[8], &objs[9], &objs[10], &objs[11]))
        return NULL;
    if (!PyType_Check(objs[0]) || !PyType_Check(objs[1]) || !PyTuple_Check(objs[6]) || PyTuple_GET_SIZE(objs[6]) != 6
        || !PyTuple_Check(objs[7]) || PyTuple_GET_SIZE(objs[7]) != 3) {
        PyErr_SetString(PyExc_TypeError, "setup(ReadableSpan, SpanContext, Resource, InstrumentationScope, Event, "
                                         "Link, 6 kinds, 3 statuses, Status, ERROR, SAMPLED, DEFAULT_TRACE_STATE)");
        return NULL;
    }
    Py_XSETREF(readable_span, Py_NewRef(objs[0]));
    Py_XSETREF(span_context, Py_NewRef(objs[1]));
    Py_XSETREF(resource_cls, Py_NewRef(objs[2]));
    PyDict_Clear(resources.made); /* made by the classes given before */
    PyDict_Clear(scopes.made);
    Py_XSETREF(scope_cls, Py_NewRef(objs[3]));
    Py_XSETREF(event_cls, Py_NewRef(objs[4]));
    Py_XSETREF(link_cls, Py_NewRef(objs[5]));
    for (int i = 0; i < 6; i++)
        Py_XSETREF(kinds[i], Py_NewRef(PyTuple_GET_ITEM(objs[6], i)));
    for (int i = 0; i < 3; i++)
        Py_XSETREF(statuses[i], Py_NewRef(PyTuple_GET_ITEM(objs[7], i)));
    Py_XSETREF(status_cls, Py_NewRef(objs[8]));
    Py_XSETREF(error_code, Py_NewRef(objs[9]));
    Py_XSETREF(sampled, Py_NewRef(objs[10]));
    Py_XSETREF(default_state, Py_NewRef(objs[11]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_spans", decode_spans, METH_O,
     "decode_spans(data) -> (spans, malformed spans, malformed links), or None when the request is off the fast path."},
    {"cache_info", cache_info, METH_NOARGS,
     "cache_info() -> {'resources' and 'scopes': (objects cached, the most it holds, times it was full and "
     "emptied)}."},
    {"setup", setup, METH_VARARGS,
     "setup(ReadableSpan, SpanContext, Resource, InstrumentationScope, Event, Link, kinds, statuses, Status, ERROR, "
     "SAMPLED, DEFAULT_TRACE_STATE)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_otlpdec", NULL, -1, methods, NULL, NULL, NULL, NULL};

#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                              \
    return NULL

PyMODINIT_FUNC PyInit__otlpdec(void)
{
    INTERN(k_name, "_name");
    INTERN(k_context, "_context");
    INTERN(k_kind, "_kind");
    INTERN(k_info, "_instrumentation_info");
    INTERN(k_scope, "_instrumentation_scope");
    INTERN(k_parent, "_parent");
    INTERN(k_start, "_start_time");
    INTERN(k_end, "_end_time");
    INTERN(k_attributes, "_attributes");
    INTERN(k_events, "_events");
    INTERN(k_links, "_links");
    INTERN(k_resource, "_resource");
    INTERN(k_status, "_status");
    INTERN(k_otlp_span, "_otlp_span");
    INTERN(empty, "");
    if ((no_args = PyTuple_New(0)) == NULL)
        return NULL;
    if ((resources.made = PyDict_New()) == NULL || (scopes.made = PyDict_New()) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
