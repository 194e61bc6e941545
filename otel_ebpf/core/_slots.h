/* The byte offset of a slotted class's field, shared by the C that fills fast_init records' slots directly
 * (otel_ebpf/bpf/_recdec.c, otel_ebpf/core/_frozen.c). Header-only: each extension gets its own static copy. */
#ifndef OTEL_EBPF_SLOTS_H
#define OTEL_EBPF_SLOTS_H
#include <Python.h>
#include <structmember.h>

/* The byte offset of ``cls``'s slot ``name``: its member descriptor, an object slot (T_OBJECT_EX). */
static inline Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *desc = PyDict_GetItemWithError(cls->tp_dict, name);
    if (desc == NULL || !Py_IS_TYPE(desc, &PyMemberDescr_Type)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s has no slot %R", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)desc)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", cls->tp_name, name);
        return -1;
    }
    return m->offset;
}

#endif
