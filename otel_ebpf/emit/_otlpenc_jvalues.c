/* otel_ebpf.emit._otlpenc: OTLP/JSON strings, numbers, ids, and attribute values and maps (otlp_json.py's
 * _str, _double, _value, _key_value, _attributes, _optional with _time, _count, _str; _trace_id, _span_id). */
#include "_otlpenc.h"

#include <math.h>

int comma(Buf *b, int *first)
{
    if (*first) {
        *first = 0;
        return OK;
    }
    return put_byte(b, ',');
}

/* A JSON string as json.dumps writes it (ensure_ascii: \" \\ \n \r \t \b \f, \u00XX, \uXXXX, surrogate
 * pairs above U+FFFF); SLOW for anything but an exact str and for a lone surrogate (protobuf refuses it). */
int put_jstr(Buf *b, PyObject *o)
{
    static const char hex[] = "0123456789abcdef";
    if (!PyUnicode_CheckExact(o))
        return SLOW;
    Py_ssize_t n = PyUnicode_GET_LENGTH(o);
    int kind = PyUnicode_KIND(o);
    const void *data = PyUnicode_DATA(o);
    if (grow(b, (size_t)n * 12 + 2)) /* at most a surrogate pair (12 bytes) a code point */
        return FAIL;
    unsigned char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '"' && c != '\\') {
            *out++ = (unsigned char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
        case '"': *out++ = '"'; continue;
        case '\\': *out++ = '\\'; continue;
        case '\n': *out++ = 'n'; continue;
        case '\r': *out++ = 'r'; continue;
        case '\t': *out++ = 't'; continue;
        case '\b': *out++ = 'b'; continue;
        case '\f': *out++ = 'f'; continue;
        default: break;
        }
        if (c >= 0xD800 && c <= 0xDFFF)
            return SLOW;
        if (c >= 0x10000) {
            Py_UCS4 v = c - 0x10000, hi = 0xD800 | (v >> 10), lo = 0xDC00 | (v & 0x3FF);
            *out++ = 'u', *out++ = 'd', *out++ = hex[(hi >> 8) & 0xF], *out++ = hex[(hi >> 4) & 0xF];
            *out++ = hex[hi & 0xF], *out++ = '\\';
            c = lo;
        }
        *out++ = 'u', *out++ = hex[(c >> 12) & 0xF], *out++ = hex[(c >> 8) & 0xF], *out++ = hex[(c >> 4) & 0xF];
        *out++ = hex[c & 0xF];
    }
    *out++ = '"';
    b->len = (size_t)(out - b->data);
    return OK;
}

int put_decimal(Buf *b, uint64_t v, int negative)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (grow(b, (size_t)n + 1))
        return FAIL;
    if (negative)
        b->data[b->len++] = '-';
    while (n)
        b->data[b->len++] = (unsigned char)digits[--n];
    return OK;
}

/* A double as otlp_json's _double: "NaN", "Infinity", "-Infinity" (quoted), else float.__repr__. */
static int put_double(Buf *b, double d)
{
    if (isnan(d))
        return PUTS(b, "\"NaN\"");
    if (isinf(d))
        return d > 0 ? PUTS(b, "\"Infinity\"") : PUTS(b, "\"-Infinity\"");
    char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return FAIL;
    int r = put(b, text, strlen(text));
    PyMem_Free(text);
    return r;
}

/* ``{"bytesValue":"<base64>"}`` (RFC 4648 with padding, as base64.b64encode). */
static int put_jbytes(Buf *b, const unsigned char *p, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (PUTS(b, "{\"bytesValue\":\"") || grow(b, (n + 2) / 3 * 4 + 2))
        return FAIL;
    unsigned char *out = b->data + b->len;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *out++ = (unsigned char)abc[v >> 18];
        *out++ = (unsigned char)abc[(v >> 12) & 0x3F];
        *out++ = i + 1 < n ? (unsigned char)abc[(v >> 6) & 0x3F] : '=';
        *out++ = i + 2 < n ? (unsigned char)abc[v & 0x3F] : '=';
    }
    *out++ = '"';
    *out++ = '}';
    b->len = (size_t)(out - b->data);
    return OK;
}

/* ``"name":"<decimal>"`` for a time: an exact int below 2**64, left out at 0 or None (_optional + _time). */
int put_jtime(Buf *b, const char *name, size_t len, PyObject *o, int *first)
{
    uint64_t v;
    if (o == Py_None)
        return OK;
    int r = as_u64(o, &v);
    return r ? r : put_jtime_u64(b, name, len, v, first);
}

/* The same from the time itself. */
int put_jtime_u64(Buf *b, const char *name, size_t len, uint64_t v, int *first)
{
    if (!v)
        return OK;
    return comma(b, first) || put(b, name, len) || put_byte(b, '"') || put_decimal(b, v, 0) || put_byte(b, '"')
        ? FAIL : OK;
}

/* ``"name":<n>`` for a uint32 count, left out at 0 (_optional + _count). */
int put_jcount(Buf *b, const char *name, size_t len, PyObject *obj, PyObject *attr, int *first)
{
    PyObject *o = PyObject_GetAttr(obj, attr);
    if (o == NULL)
        return FAIL;
    uint64_t v;
    int r = as_u64(o, &v);
    Py_DECREF(o);
    if (r || !v)
        return r;
    if (v >> 32)
        return SLOW;
    return comma(b, first) || put(b, name, len) || put_decimal(b, v, 0) ? FAIL : OK;
}

/* ``"name":"<text>"`` for a string, left out when falsy (_optional + _str). */
int put_jstring(Buf *b, const char *name, size_t len, PyObject *o, int *first)
{
    if (o == Py_None || (PyUnicode_CheckExact(o) && PyUnicode_GET_LENGTH(o) == 0))
        return OK;
    if (!PyUnicode_CheckExact(o))
        return SLOW;
    return comma(b, first) || put(b, name, len) ? FAIL : put_jstr(b, o);
}

int put_jstring_attr(Buf *b, const char *name, size_t len, PyObject *obj, PyObject *attr, int *first)
{
    PyObject *o = PyObject_GetAttr(obj, attr);
    if (o == NULL)
        return FAIL;
    int r = put_jstring(b, name, len, o, first);
    Py_DECREF(o);
    return r;
}

#define MAX_DEPTH 32

/* The AnyValue object of one attribute value (_value); dict values: SLOW. */
static int put_jvalue(Buf *b, PyObject *v, int depth)
{
    if (PyUnicode_CheckExact(v))
        return PUTS(b, "{\"stringValue\":") || put_jstr(b, v) || put_byte(b, '}') ? (PyErr_Occurred() ? FAIL : SLOW)
                                                                                  : OK;
    if (PyLong_CheckExact(v)) {
        uint64_t x;
        int r = as_i64(v, &x);
        if (r)
            return r;
        int negative = (int64_t)x < 0;
        return PUTS(b, "{\"intValue\":\"") || put_decimal(b, negative ? -(uint64_t)x : x, negative)
            || PUTS(b, "\"}") ? FAIL : OK;
    }
    if (PyBool_Check(v))
        return v == Py_True ? PUTS(b, "{\"boolValue\":true}") : PUTS(b, "{\"boolValue\":false}");
    if (PyFloat_CheckExact(v))
        return PUTS(b, "{\"doubleValue\":") || put_double(b, PyFloat_AS_DOUBLE(v)) || put_byte(b, '}') ? FAIL : OK;
    if (v == Py_None)
        return PUTS(b, "{}");
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (n == 0)
            return PUTS(b, "{\"arrayValue\":{}}");
        if (depth >= MAX_DEPTH)
            return SLOW;
        if (PUTS(b, "{\"arrayValue\":{\"values\":["))
            return FAIL;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = (i && put_byte(b, ',')) ? FAIL : put_jvalue(b, PySequence_Fast_GET_ITEM(v, i), depth + 1);
            if (r)
                return r;
        }
        return PUTS(b, "]}}");
    }
    if (PyBytes_CheckExact(v))
        return put_jbytes(b, (const unsigned char *)PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
    return SLOW;
}

/* ``"attributes":[...]``, left out when there are none (_attributes). */
int put_jattributes(Buf *b, PyObject *attributes, int *first)
{
    if (attributes == Py_None)
        return OK;
    PyObject *items = PyDict_CheckExact(attributes) ? PyDict_Items(attributes) : PyMapping_Items(attributes);
    if (items == NULL)
        return FAIL;
    int r = OK;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (n && (comma(b, first) || PUTS(b, "\"attributes\":[")))
        r = FAIL;
    for (Py_ssize_t i = 0; i < n && !r; i++) {
        PyObject *pair = PyList_GET_ITEM(items, i);
        PyObject *key = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? PyTuple_GET_ITEM(pair, 0) : NULL;
        if (key == NULL || !PyUnicode_CheckExact(key))
            r = SLOW;
        else if ((i && put_byte(b, ',')) || put_byte(b, '{'))
            r = FAIL;
        else if (PyUnicode_GET_LENGTH(key) && (PUTS(b, "\"key\":") || (r = put_jstr(b, key)) || put_byte(b, ',')))
            r = r ? r : FAIL;
        else if (PUTS(b, "\"value\":") || (r = put_jvalue(b, PyTuple_GET_ITEM(pair, 1), 0)) || put_byte(b, '}'))
            r = r ? r : FAIL;
    }
    Py_DECREF(items);
    return r || !n ? r : put_byte(b, ']');
}

int put_jattributes_attr(Buf *b, PyObject *obj, int *first)
{
    PyObject *a = PyObject_GetAttr(obj, s_attributes);
    if (a == NULL)
        return FAIL;
    int r = put_jattributes(b, a, first);
    Py_DECREF(a);
    return r;
}

/* ``"<name>":"<hex>"`` of an id: an exact int below 2**(8*size) (_trace_id, _span_id). */
int put_jid(Buf *b, const char *name, size_t len, PyObject *context, Py_ssize_t i, PyObject *attr,
                   size_t size)
{
    PyObject *o = context_item(context, i, attr);
    if (o == NULL)
        return FAIL;
    int r = put_jid_of(b, name, len, o, size);
    Py_DECREF(o);
    return r;
}

/* The same from the id itself. */
int put_jid_of(Buf *b, const char *name, size_t len, PyObject *id, size_t size)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char bytes[32];
    Buf raw = {bytes, 0, sizeof bytes}; /* tag, size, then at most 16 bytes big-endian: never grows */
    int r = put_id(&raw, 0, id, size);
    if (!r && (put(b, name, len) || put_byte(b, '"') || grow(b, 2 * size + 1)))
        r = FAIL;
    for (size_t k = 0; !r && k < size; k++) {
        b->data[b->len++] = (unsigned char)hex[raw.data[2 + k] >> 4];
        b->data[b->len++] = (unsigned char)hex[raw.data[2 + k] & 0xF];
    }
    return r ? r : put_byte(b, '"');
}
