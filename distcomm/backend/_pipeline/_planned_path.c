/* The planned path compiled: Steps._planned's common case in C (issue 43).
 *
 * accelerate(function, hooks, not_planned, completed) wraps Steps._planned (the Python
 * function, ``function``) in a PlannedPath: a method descriptor (Python's LOAD_METHOD calls it
 * with the communicator first, making no bound method) that runs a call itself where it is
 * the common case, and hands every other call to ``function``, untouched, before it changes
 * anything:
 *
 *   - a call of the kind of its op's latest planned call (``_last_kind``: the class, the dtype
 *     object, the byte size, the root as it was or an equal int), whose kind has a plan, whose
 *     ``y`` fits (``fits`` None, or a plans.Fits read as data, or a check that answers true),
 *     on a usable communicator, short of the next check point (``_next_check``);
 *   - no hook registered (``hooks``, observing.registered, is empty) and the kind's fingerprint
 *     the mismatch check's ``free_fp`` (its current run, where the ranks agreed that a call
 *     may repeat it unchecked), or no check;
 *   - no flight recorder, or one on the CPU clock (``bound_device`` None) whose caller is the
 *     site the last recorded call found (``_site_code``, through ``_site_via``).
 *
 * There it does what the Python does: numbers the call (``op``, ``seq``), marks it "blocked
 * in" (``blocked_seq``), adds the recorder's entry, runs the plan, stamps the entry; a plan's
 * exception goes to the communicator's ``_plan_declined`` (NotPlanned) or ``_plan_failed``.
 * The communicator's slots are read at their offsets, found once per class from its member
 * descriptors (a class whose attribute is no slot takes the Python for every call).
 * test_plans.py runs the same calls through both and compares what they leave.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* The communicator's slots the path reads or writes (index into Offsets.at). */
enum { SEQ, NEXT_CHECK, UNUSABLE, LAST_KIND, CHECK, RECORDER, BOUND_DEVICE, BLOCKED_SEQ, OP,
       SITE_CODE, SITE_VIA, ENTRY, BLOCKED_OP, P2P_MARKS, N_SLOTS };
static const char *slot_names[N_SLOTS] = {
    "seq", "_next_check", "unusable", "_last_kind", "_mismatch_check", "_recorder",
    "bound_device", "blocked_seq", "op", "_site_code", "_site_via", "_entry", "blocked_op",
    "p2p_marks"};

/* plans.OUTPUT, NOTHING and PARTS: how a kind's Fits checks ``y``. */
enum { FITS_OUTPUT = 1, FITS_NOTHING = 2, FITS_PARTS = 3 };

typedef struct {
    PyTypeObject *type; /* the class they were found for (borrowed: compared, never used) */
    int usable;         /* 0: a name is no slot of it */
    Py_ssize_t at[N_SLOTS];
} Offsets;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function;    /* Steps._planned, the Python */
    PyObject *hooks;       /* observing.registered (a list, changed in place) */
    PyObject *not_planned; /* engine.NotPlanned */
    Py_ssize_t completed;  /* recording.COMPLETED */
    Offsets comm;          /* the communicator's class */
    PyTypeObject *check_type;
    Py_ssize_t free_fp;    /* MismatchCheck.free_fp's offset (-1: no slot) */
} PlannedPath;

static PyObject *s_dtype, *s_nbytes, *s_shape, *s_add, *s_declined, *s_failed, *s_raised,
    *zero, *empty;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static Py_ssize_t slot_offset(PyTypeObject *type, const char *name) {
    PyObject *key = PyUnicode_InternFromString(name);
    if (key == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject *found = _PyType_Lookup(type, key); /* borrowed; never raises */
    Py_DECREF(key);
    if (found == NULL || !Py_IS_TYPE(found, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)found)->d_member;
    return member->type == T_OBJECT_EX || member->type == T_OBJECT ? member->offset : -1;
}

static int find_offsets(Offsets *o, PyTypeObject *type) {
    o->type = type;
    o->usable = 0;
    for (int i = 0; i < N_SLOTS; i++) {
        o->at[i] = slot_offset(type, slot_names[i]);
        if (o->at[i] < 0)
            return 0;
    }
    o->usable = 1;
    return 1;
}

/* A slot's value (borrowed), or NULL when it is unset. */
static inline PyObject *get(PyObject *obj, Py_ssize_t off) { return SLOT(obj, off); }

static inline void set(PyObject *obj, Py_ssize_t off, PyObject *value) {
    PyObject *old = SLOT(obj, off);
    Py_INCREF(value);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

static PyObject *wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return PyFloat_FromDouble((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

/* x's attribute ``name`` as a Py_ssize_t (-1 and no error: not there, or no int). */
static Py_ssize_t size_attr(PyObject *x, PyObject *name) {
    PyObject *v = PyObject_GetAttr(x, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t n = PyLong_Check(v) ? PyLong_AsSsize_t(v) : -1;
    Py_DECREF(v);
    if (n == -1 && PyErr_Occurred())
        PyErr_Clear();
    return n;
}

/* Whether array ``a`` is of ``cls``, ``dtype`` (the object) and ``nbytes``: 1, 0, or 0 with no
 * error where an attribute is missing (the pipeline explains such a call). */
static int array_is(PyObject *a, PyObject *cls, PyObject *dtype, Py_ssize_t nbytes) {
    if (nbytes < 0 || (PyObject *)Py_TYPE(a) != cls)
        return 0;
    PyObject *d = PyObject_GetAttr(a, s_dtype);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(d); /* compared by identity only */
    return d == dtype && size_attr(a, s_nbytes) == nbytes;
}

/* Whether ``x`` is of the class, dtype and byte size of kind ``last`` (an op's latest:
 * (class, dtype, byte size, root, entry)); 0 and no error otherwise. */
static int of_kind(PyObject *x, PyObject *last) {
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(last, 2));
    if (nbytes == -1 && PyErr_Occurred())
        PyErr_Clear();
    return array_is(x, PyTuple_GET_ITEM(last, 0), PyTuple_GET_ITEM(last, 1), nbytes);
}

/* Whether ``given`` is the kind's ``known`` root, peer or tag: the same object, or an equal
 * int. */
static int same_int(PyObject *given, PyObject *known) {
    return given == known ||
           (PyLong_CheckExact(given) && PyLong_CheckExact(known) &&
            PyObject_RichCompareBool(given, known, Py_EQ) == 1);
}

/* A kind's check of ``y`` (plans.Fits: (how, class, dtype, byte size, count)) read as data:
 * 1 it fits, 0 it does not, -1 not such a tuple (the check is called). */
static int fits_as_data(PyObject *fits, PyObject *y) {
    if (PyTuple_CheckExact(fits) || !PyTuple_Check(fits) || PyTuple_GET_SIZE(fits) != 5)
        return -1;
    long how = PyLong_AsLong(PyTuple_GET_ITEM(fits, 0));
    PyObject *cls = PyTuple_GET_ITEM(fits, 1), *dtype = PyTuple_GET_ITEM(fits, 2);
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(fits, 3));
    Py_ssize_t count = PyLong_AsSsize_t(PyTuple_GET_ITEM(fits, 4));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    switch (how) {
    case FITS_OUTPUT:
        return array_is(y, cls, dtype, nbytes);
    case FITS_NOTHING:
        return y == Py_None;
    case FITS_PARTS:
        if (!(PyList_CheckExact(y) || PyTuple_CheckExact(y)) || PySequence_Fast_GET_SIZE(y) != count)
            return 0;
        for (Py_ssize_t i = 0; i < count; i++)
            if (!array_is(PySequence_Fast_GET_ITEM(y, i), cls, dtype, nbytes))
                return 0;
        return 1;
    default:
        return -1;
    }
}

/* The recorder's site of a call made from the frame below the current one (the public
 * method's caller, or its module function's), or NULL: not the site the last recorded call
 * found (the Python finds it). A new reference. */
static PyObject *known_site(PyObject *comm, const Offsets *o) {
#if PY_VERSION_HEX >= 0x030B0000
    PyFrameObject *here = PyEval_GetFrame(); /* the public method's (borrowed) */
    if (here == NULL)
        return NULL;
    PyFrameObject *frame = PyFrame_GetBack(here);
    if (frame == NULL)
        return NULL;
    PyCodeObject *code = PyFrame_GetCode(frame);
    if ((PyObject *)code == get(comm, o->at[SITE_VIA])) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        Py_DECREF(code);
        if (back == NULL)
            return NULL;
        frame = back;
        code = PyFrame_GetCode(frame);
    }
    PyObject *site = NULL;
    if ((PyObject *)code == get(comm, o->at[SITE_CODE])) {
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
        if (lasti != NULL) {
            site = PyTuple_Pack(2, (PyObject *)code, lasti);
            Py_DECREF(lasti);
        }
        if (site == NULL)
            PyErr_Clear();
    }
    Py_DECREF(code);
    Py_DECREF(frame);
    return site;
#else
    (void)comm;
    (void)o;
    return NULL; /* Python 3.10: the Python records */
#endif
}

/* The plan raised (the error set): the communicator's handlers, as the Python's except
 * clauses call them; ``record`` or NULL. */
static PyObject *plan_raised(PlannedPath *self, PyObject *comm, PyObject *op, PyObject *seq,
                             PyObject *record) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *rec = record != NULL ? record : Py_None;
    PyObject *result = NULL;
    if (PyObject_IsInstance(value, self->not_planned) == 1) {
        result = PyObject_CallMethodObjArgs(comm, s_declined, seq, rec, Py_None, NULL);
    } else {
        PyObject *error = PyObject_CallMethodObjArgs(comm, s_failed, op, seq, value, rec, Py_None,
                                                     NULL);
        if (error != NULL) {
            if (error == value) {
                PyErr_Restore(type, value, tb); /* raised as it is */
                type = value = tb = NULL;
            } else {
                Py_INCREF(value);
                PyException_SetContext(error, value); /* steals the reference */
                PyErr_SetObject((PyObject *)Py_TYPE(error), error);
            }
            Py_DECREF(error);
        }
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return result;
}

/* The op's latest kind in ``kinds`` (``_last_kind``: (class, dtype, byte size, root, entry)),
 * a new reference (held while the call is looked at: a look at x may run Python that changes
 * the kinds), or NULL (no error set): none. */
static PyObject *latest_kind(PyObject *kinds, PyObject *op) {
    PyObject *last = PyDict_GetItemWithError(kinds, op);
    if (last == NULL || !PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 5) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(last);
    return last;
}

/* The offsets of ``comm``'s slots (found once per class), or NULL: a name is no slot of it. */
static Offsets *offsets_of(PlannedPath *self, PyObject *comm) {
    Offsets *o = &self->comm;
    if (Py_TYPE(comm) != o->type)
        find_offsets(o, Py_TYPE(comm));
    return o->usable ? o : NULL;
}

static PyObject *fallback(PlannedPath *self, PyObject *const *args, size_t nargsf) {
    return PyObject_Vectorcall(self->function, args, nargsf, NULL);
}

static PyObject *planned_kind(PlannedPath *self, PyObject *const *args, size_t nargsf,
                              Offsets *o, Py_ssize_t seq, PyObject *last);

/* self._planned(op, x, root=None, y=None), the communicator first. */
static PyObject *planned_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    PlannedPath *self = (PlannedPath *)callable;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || n < 3 || n > 5)
        return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    PyObject *comm = args[0], *op = args[1];
    Offsets *o = offsets_of(self, comm);
    if (o == NULL)
        return fallback(self, args, nargsf);

    PyObject *seq_now = get(comm, o->at[SEQ]), *next = get(comm, o->at[NEXT_CHECK]);
    PyObject *kinds = get(comm, o->at[LAST_KIND]);
    if (seq_now == NULL || next == NULL || kinds == NULL || !PyLong_CheckExact(seq_now) ||
        !PyLong_CheckExact(next) || !PyDict_CheckExact(kinds) ||
        get(comm, o->at[UNUSABLE]) != Py_None)
        return fallback(self, args, nargsf);
    Py_ssize_t seq = PyLong_AsSsize_t(seq_now);
    if (seq == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return fallback(self, args, nargsf);
    }
    seq += 1;
    Py_ssize_t next_check = PyLong_AsSsize_t(next);
    if (next_check == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return fallback(self, args, nargsf);
    }
    if (seq >= next_check || PyList_GET_SIZE(self->hooks) != 0)
        return fallback(self, args, nargsf);

    PyObject *last = latest_kind(kinds, op);
    if (last == NULL)
        return fallback(self, args, nargsf);
    PyObject *result = planned_kind(self, args, nargsf, o, seq, last);
    Py_DECREF(last);
    return result;
}

/* planned_call past the look-up of the op's latest kind, ``last`` (held by the caller). */
static PyObject *planned_kind(PlannedPath *self, PyObject *const *args, size_t nargsf,
                              Offsets *o, Py_ssize_t seq, PyObject *last) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *comm = args[0], *op = args[1], *x = args[2];
    PyObject *root = n > 3 ? args[3] : Py_None, *y = n > 4 ? args[4] : Py_None;
    PyObject *entry = PyTuple_GET_ITEM(last, 4);
    if ((root != Py_None && !PyLong_CheckExact(root)) || /* True is no rank */
        !same_int(root, PyTuple_GET_ITEM(last, 3)) || !of_kind(x, last) ||
        !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4)
        return fallback(self, args, nargsf);
    PyObject *plan = PyTuple_GET_ITEM(entry, 0), *fp = PyTuple_GET_ITEM(entry, 1);
    PyObject *fits = PyTuple_GET_ITEM(entry, 2), *name = PyTuple_GET_ITEM(entry, 3);
    if (plan == Py_None)
        return fallback(self, args, nargsf);

    /* the mismatch check's current run, if a call may repeat it unchecked */
    PyObject *check = get(comm, o->at[CHECK]);
    if (check == NULL)
        return fallback(self, args, nargsf);
    if (check != Py_None) {
        if (Py_TYPE(check) != self->check_type) {
            self->check_type = Py_TYPE(check);
            self->free_fp = slot_offset(self->check_type, "free_fp");
        }
        PyObject *free_fp = self->free_fp < 0 ? NULL : get(check, self->free_fp);
        if (free_fp == NULL)
            return fallback(self, args, nargsf);
        if (free_fp != fp) {
            int same = PyObject_RichCompareBool(fp, free_fp, Py_EQ);
            if (same != 1) {
                PyErr_Clear();
                return fallback(self, args, nargsf);
            }
        }
    }

    /* the flight recorder: a known site on the CPU clock, else the Python */
    PyObject *recorder = get(comm, o->at[RECORDER]), *site = NULL;
    if (recorder == NULL)
        return fallback(self, args, nargsf);
    if (recorder != Py_None) {
        if (get(comm, o->at[BOUND_DEVICE]) != Py_None)
            return fallback(self, args, nargsf);
        site = known_site(comm, o);
        if (site == NULL)
            return fallback(self, args, nargsf);
    }

    if (fits != Py_None) { /* y checked (a call may raise: nothing has changed) */
        int fit = fits_as_data(fits, y);
        if (fit < 0) {
            PyObject *ok = PyObject_CallOneArg(fits, y);
            fit = ok == NULL ? -1 : PyObject_IsTrue(ok);
            Py_XDECREF(ok);
        }
        if (fit != 1) {
            Py_XDECREF(site);
            return fit < 0 ? NULL : fallback(self, args, nargsf);
        }
    }

    /* the call, numbered */
    PyObject *seq_obj = PyLong_FromSsize_t(seq);
    if (seq_obj == NULL) {
        Py_XDECREF(site);
        return NULL;
    }
    set(comm, o->at[OP], op);
    set(comm, o->at[SEQ], seq_obj);
    set(comm, o->at[BLOCKED_SEQ], seq_obj);
    PyObject *record = NULL, *result = NULL;
    if (site != NULL) {
        PyObject *shape = PyObject_GetAttr(x, s_shape);
        PyObject *issued = shape == NULL ? NULL : wall();
        if (issued != NULL)
            record = PyList_New(7);
        if (record != NULL) {
            PyObject *items[7] = {name, seq_obj, shape, site, issued, Py_None, Py_None};
            for (int i = 0; i < 7; i++) {
                Py_INCREF(items[i]);
                PyList_SET_ITEM(record, i, items[i]);
            }
            PyObject *added = PyObject_CallMethodOneArg(recorder, s_add, record);
            if (added == NULL)
                Py_CLEAR(record);
            Py_XDECREF(added);
        }
        Py_XDECREF(shape);
        Py_XDECREF(issued);
        Py_DECREF(site);
        if (record == NULL)
            goto raised; /* as the Python's: the error goes through the plan's handlers */
        set(comm, o->at[ENTRY], Py_None); /* no later engine call stamps this entry */
    }
    PyObject *plan_args[2] = {x, y};
    Py_INCREF(plan); /* held: a plan's exception may make the kit forget its kinds */
    PyObject *moved = PyObject_Vectorcall(plan, plan_args, 2, NULL);
    Py_DECREF(plan);
    if (moved == NULL)
        goto raised;
    Py_DECREF(moved);
    set(comm, o->at[BLOCKED_SEQ], zero);
    if (record != NULL) {
        PyObject *done = wall();
        if (done == NULL || PyList_SetItem(record, self->completed, done) < 0) {
            Py_DECREF(record);
            Py_DECREF(seq_obj);
            return NULL;
        }
        Py_DECREF(record);
    }
    Py_DECREF(seq_obj);
    Py_RETURN_TRUE;

raised:
    result = plan_raised(self, comm, op, seq_obj, record);
    set(comm, o->at[BLOCKED_SEQ], zero);
    Py_XDECREF(record);
    Py_DECREF(seq_obj);
    return result;
}

static PyObject *message_kind(PlannedPath *self, PyObject *const *args, size_t nargsf,
                              Offsets *o, PyObject *last);

/* self._planned_message(op, x, peer, tag), the communicator first: PointToPoint's Python for
 * a message of its op's latest kind (``_last_kind``: the class, dtype, byte size, (peer,
 * tag)) with a plan, on a usable communicator, the peer None or an int and the tag an int;
 * every other message goes to the Python untouched. */
static PyObject *message_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    PlannedPath *self = (PlannedPath *)callable;
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 5)
        return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    PyObject *comm = args[0], *op = args[1], *peer = args[3], *tag = args[4];
    Offsets *o = offsets_of(self, comm);
    if (o == NULL)
        return fallback(self, args, nargsf);
    PyObject *kinds = get(comm, o->at[LAST_KIND]), *marks = get(comm, o->at[P2P_MARKS]);
    if (kinds == NULL || marks == NULL || !PyDict_CheckExact(kinds) ||
        get(comm, o->at[UNUSABLE]) != Py_None || !PyLong_CheckExact(tag) ||
        (peer != Py_None && !PyLong_CheckExact(peer)))
        return fallback(self, args, nargsf);
    PyObject *last = latest_kind(kinds, op);
    if (last == NULL)
        return fallback(self, args, nargsf);
    PyObject *result = message_kind(self, args, nargsf, o, last);
    Py_DECREF(last);
    return result;
}

/* message_call past the look-up of the op's latest kind, ``last`` (held by the caller). */
static PyObject *message_kind(PlannedPath *self, PyObject *const *args, size_t nargsf,
                              Offsets *o, PyObject *last) {
    PyObject *comm = args[0], *x = args[2], *peer = args[3], *tag = args[4];
    PyObject *marks = get(comm, o->at[P2P_MARKS]);
    PyObject *where = PyTuple_GET_ITEM(last, 3), *entry = PyTuple_GET_ITEM(last, 4);
    if (marks == NULL || !PyTuple_CheckExact(where) || PyTuple_GET_SIZE(where) != 2 ||
        !same_int(peer, PyTuple_GET_ITEM(where, 0)) || !same_int(tag, PyTuple_GET_ITEM(where, 1)) ||
        !of_kind(x, last) || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4 ||
        PyTuple_GET_ITEM(entry, 0) == Py_None)
        return fallback(self, args, nargsf);
    PyObject *plan = PyTuple_GET_ITEM(entry, 0), *label = PyTuple_GET_ITEM(entry, 3);
    Py_INCREF(plan); /* held: a plan's exception may make the kit forget its kinds */
    Py_INCREF(label);
    PyObject *next = PyIter_Next(marks), *mark = next == NULL ? NULL : PyNumber_Negative(next);
    Py_XDECREF(next);
    if (mark == NULL) {
        Py_DECREF(plan);
        Py_DECREF(label);
        return PyErr_Occurred() ? NULL : fallback(self, args, nargsf);
    }
    set(comm, o->at[BLOCKED_OP], label);
    set(comm, o->at[BLOCKED_SEQ], mark);
    Py_DECREF(mark);
    PyObject *plan_args[2] = {x, Py_None};
    PyObject *result = PyObject_Vectorcall(plan, plan_args, 2, NULL);
    if (result == NULL) { /* _message_raised(label, exc): _NOT_RUN, or it raises */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        result = PyObject_CallMethodObjArgs(comm, s_raised, label, value, NULL);
        if (result == NULL) {
            PyObject *t2, *v2, *tb2; /* the handler's error, caused or raised in handling value */
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (v2 != value) {
                Py_INCREF(value);
                PyException_SetContext(v2, value);
            }
            PyErr_Restore(t2, v2, tb2);
        }
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    set(comm, o->at[BLOCKED_SEQ], zero);
    set(comm, o->at[BLOCKED_OP], empty);
    Py_DECREF(plan);
    Py_DECREF(label);
    return result;
}

static PyObject *path_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static int path_traverse(PlannedPath *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->hooks);
    Py_VISIT(self->not_planned);
    return 0;
}

static int path_clear(PlannedPath *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->not_planned);
    return 0;
}

static void path_dealloc(PlannedPath *self) {
    PyObject_GC_UnTrack(self);
    path_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *path_wrapped(PlannedPath *self, void *closure) {
    Py_INCREF(self->function);
    return self->function;
}

static PyGetSetDef path_getset[] = {
    {"__wrapped__", (getter)path_wrapped, NULL, "the Python it runs the common case of", NULL},
    {NULL}};

static PyTypeObject PlannedPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "distcomm.backend._pipeline._planned_path.PlannedPath",
    .tp_basicsize = sizeof(PlannedPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Steps._planned's common case compiled; every other call runs __wrapped__.",
    .tp_vectorcall_offset = offsetof(PlannedPath, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = path_get,
    .tp_traverse = (traverseproc)path_traverse,
    .tp_clear = (inquiry)path_clear,
    .tp_dealloc = (destructor)path_dealloc,
    .tp_getset = path_getset,
};

static PyObject *new_path(vectorcallfunc call, PyObject *function, PyObject *hooks,
                          PyObject *not_planned, Py_ssize_t completed) {
    PlannedPath *self = PyObject_GC_New(PlannedPath, &PlannedPathType);
    if (self == NULL)
        return NULL;
    self->vectorcall = call;
    Py_INCREF(function);
    self->function = function;
    Py_INCREF(hooks);
    self->hooks = hooks;
    Py_INCREF(not_planned);
    self->not_planned = not_planned;
    self->completed = completed;
    self->comm.type = NULL;
    self->comm.usable = 0;
    self->check_type = NULL;
    self->free_fp = -1;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *accelerate(PyObject *module, PyObject *args) {
    PyObject *function, *hooks, *not_planned;
    Py_ssize_t completed;
    if (!PyArg_ParseTuple(args, "OO!On", &function, &PyList_Type, &hooks, &not_planned,
                          &completed))
        return NULL;
    if (completed < 0 || completed >= 7) {
        PyErr_Format(PyExc_ValueError, "completed is %zd; an entry has 7 fields", completed);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    /* free-threaded Python: the slots are written without the lock the Python's stores take */
    Py_INCREF(function);
    return function;
#endif
    return new_path(planned_call, function, hooks, not_planned, completed);
}

static PyObject *accelerate_messages(PyObject *module, PyObject *function) {
#ifdef Py_GIL_DISABLED
    Py_INCREF(function);
    return function;
#endif
    return new_path(message_call, function, Py_None, Py_None, 0);
}

/* apart(output, input): whether ``output`` may be written from ``input`` as they are, read
 * through the buffer protocol in one look: both C-contiguous, the output writable, their
 * memory disjoint (exact for contiguous memory); None where an object exports no buffer (the
 * caller looks in Python). NumpyAdapter.plain_pair's look, about 0.7 us less than its flags
 * and numpy's may_share_memory. */
static PyObject *apart(PyObject *module, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_Format(PyExc_TypeError, "apart(output, input) takes 2 arguments, not %zd", n);
        return NULL;
    }
    if (args[0] == args[1])
        Py_RETURN_FALSE;
    Py_buffer out, in;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_STRIDES) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[1], &in, PyBUF_STRIDES) < 0) {
        PyBuffer_Release(&out);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const char *o = out.buf, *i = in.buf;
    int ok = !out.readonly && PyBuffer_IsContiguous(&out, 'C') && PyBuffer_IsContiguous(&in, 'C') &&
             (out.len == 0 || in.len == 0 || o + out.len <= i || i + in.len <= o);
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyBool_FromLong(ok);
}

static PyMethodDef module_methods[] = {
    {"apart", (PyCFunction)(void (*)(void))apart, METH_FASTCALL,
     "apart(output, input): both C-contiguous buffers, the output writable, their memory "
     "disjoint; None where one exports no buffer."},
    {"accelerate", accelerate, METH_VARARGS,
     "accelerate(function, hooks, not_planned, completed): Steps._planned with its common case "
     "compiled."},
    {"accelerate_messages", accelerate_messages, METH_O,
     "accelerate_messages(function): PointToPoint._planned_message with its common case "
     "compiled."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_planned_path",
    .m_doc = "Steps._planned's common case compiled.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__planned_path(void) {
    if (PyType_Ready(&PlannedPathType) < 0)
        return NULL;
    s_dtype = PyUnicode_InternFromString("dtype");
    s_nbytes = PyUnicode_InternFromString("nbytes");
    s_shape = PyUnicode_InternFromString("shape");
    s_add = PyUnicode_InternFromString("add");
    s_declined = PyUnicode_InternFromString("_plan_declined");
    s_failed = PyUnicode_InternFromString("_plan_failed");
    s_raised = PyUnicode_InternFromString("_message_raised");
    zero = PyLong_FromLong(0);
    empty = PyUnicode_FromString("");
    if (!s_dtype || !s_nbytes || !s_shape || !s_add || !s_declined || !s_failed || !s_raised ||
        !zero || !empty)
        return NULL;
    return PyModule_Create(&module_def);
}
