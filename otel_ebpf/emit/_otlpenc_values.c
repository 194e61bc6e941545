/* otel_ebpf.emit._otlpenc: strings, numbers, ids, and attribute values and maps (otlp_proto.py's _utf8,
 * _string, _time, _count, _trace_id/_span_id, _value, _key_value, _attributes). */
#include "_otlpenc.h"

/* A str's UTF-8 bytes: SLOW for anything but an exact str, and for a lone surrogate. */
int utf8(PyObject *o, const char **p, Py_ssize_t *n)
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
int put_string(Buf *b, unsigned char tag, PyObject *o)
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
int as_u64(PyObject *o, uint64_t *v)
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

int as_i64(PyObject *o, uint64_t *v)
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
int put_time(Buf *b, unsigned char tag, PyObject *o)
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
int put_count(Buf *b, unsigned char tag, PyObject *o)
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

/* An id: an exact int below 2**(8*size), written big-endian as a bytes field of that size. */
int put_id(Buf *b, unsigned char tag, PyObject *o, size_t size)
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

int put_attributes(Buf *b, unsigned char tag, PyObject *attributes);

#define MAX_DEPTH 32 /* arrays nested deeper: SLOW (Python's path decides) */

/* The AnyValue body of one attribute value, as _value (dict values: SLOW). */
int put_value(Buf *b, PyObject *v, int depth)
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

int put_key_value(Buf *b, unsigned char tag, PyObject *key, PyObject *value)
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
int put_attributes(Buf *b, unsigned char tag, PyObject *attributes)
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

/* ``put(b, tag, obj.<name>)``: one field written from an attribute of ``obj``. */
int put_attr(Buf *b, unsigned char tag, PyObject *obj, PyObject *name, Put put)
{
    PyObject *o = PyObject_GetAttr(obj, name);
    if (o == NULL)
        return FAIL;
    int r = put(b, tag, o);
    Py_DECREF(o);
    return r;
}

/* What ``write`` writes for ``obj``, kept on ``obj`` as its attribute ``key`` (bytes) the first time and written
 * from there after. For a resource: the SDK's Resource never changes (opentelemetry-sdk 1.x resources/__init__.py:
 * its attributes an immutable BoundedAttributes, its schema URL a str), and each read of its attributes runs the
 * Mapping protocol in Python, once per resource per batch (a gateway's batch holds the spans of a hundred hosts'
 * ranks). ``write`` must write the same for equal objects, as the encoders do. An object that takes no attribute
 * is written each time. */
int put_kept(Buf *b, PyObject *obj, PyObject *key, Write write)
{
    PyObject *kept = NULL;
#if PY_VERSION_HEX >= 0x030D0000
    int found = PyObject_GetOptionalAttr(obj, key, &kept);
#else
    int found = _PyObject_LookupAttr(obj, key, &kept);
#endif
    if (found < 0)
        return FAIL;
    if (kept != NULL && PyBytes_CheckExact(kept)) {
        int r = put(b, PyBytes_AS_STRING(kept), (size_t)PyBytes_GET_SIZE(kept));
        Py_DECREF(kept);
        return r;
    }
    Py_XDECREF(kept);
    size_t from = b->len;
    int r = write(b, obj);
    if (r)
        return r;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)b->data + from, (Py_ssize_t)(b->len - from));
    if (bytes == NULL)
        return FAIL;
    if (PyObject_SetAttr(obj, key, bytes) < 0)
        PyErr_Clear(); /* no attributes on it (slots): written again next time */
    Py_DECREF(bytes);
    return OK;
}
