/* wasihost.engine._fastcall: one command call of the ABI as ONE crossing from Python.
 *
 * Instance.call (engine/instance.py) runs a command in five steps, each a ctypes call into
 * libwasmtime: set the fuel, set the epoch deadline, call wasihost_alloc, call wasihost_call,
 * read the fuel back; with the copies of the name and payload in and of the answer out done
 * in Python between them. This module does the same steps in C, in the same order, on the
 * same objects (the Store's context, the two functions, their argument arrays, the trap slot,
 * the memory), and returns what Python needs to finish the call. Everything that decides or
 * reports a failure stays in Python: this code only says which check failed, with the numbers.
 *
 * The libwasmtime functions are not linked: engine/fastcall.py hands their addresses (taken
 * from the library wasmtime-py loaded) to bind(), once, after checking the wasmtime version is
 * one whose C API these declarations match. The wasmtime wheel ships no headers, so the few
 * types are declared here, from wasmtime's documented C API (wasmtime/func.h, store.h,
 * memory.h): every pointer argument is opaque to this code but the value array.
 *
 * The GIL: released across each guest crossing unless the caller keeps it (a short call,
 * docs/engine.md "Threads and the GIL"), exactly as the ctypes prototypes do (CDLL releases
 * it, PyDLL keeps it).
 *
 * Host calls come back through the trampolines below, not through ctypes callbacks (a ctypes
 * callback builds its argument objects through its converters and costs most of a small host
 * call): host_trampoline calls an import's Python dispatch with four ints; native_trampoline
 * serves a native-convention import whose parameters and result are integers from C, with no
 * Python frame of the engine's, calling the handler itself and falling back to the engine's
 * Python closures for everything but the common case (docs/engine.md "Host-call
 * trampolines").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <sched.h>
#include <time.h>

typedef struct wasmtime_error wasmtime_error_t;
typedef struct wasm_trap_t wasm_trap_t;
typedef struct wasmtime_context wasmtime_context_t;
typedef struct wasmtime_func wasmtime_func_t;
typedef struct wasmtime_memory wasmtime_memory_t;

/* wasmtime_val_raw_t: a 16-byte union (i32, i64, f32, f64, v128, references); this code
 * reads and writes its i32 and i64 members, the low bytes, little-endian. bind() checks the
 * size Python's binding declares. */
typedef union {
    int32_t i32;
    int64_t i64;
    uint8_t v128[16];
} raw_val_t;

typedef wasmtime_error_t *(*func_call_unchecked_fn)(
    wasmtime_context_t *, const wasmtime_func_t *, raw_val_t *, size_t, wasm_trap_t **);
typedef wasmtime_error_t *(*set_fuel_fn)(wasmtime_context_t *, uint64_t);
typedef wasmtime_error_t *(*get_fuel_fn)(const wasmtime_context_t *, uint64_t *);
typedef void (*set_epoch_deadline_fn)(wasmtime_context_t *, uint64_t);
typedef uint8_t *(*memory_data_fn)(const wasmtime_context_t *, const wasmtime_memory_t *);
typedef size_t (*memory_data_size_fn)(const wasmtime_context_t *, const wasmtime_memory_t *);
typedef wasm_trap_t *(*trap_new_fn)(const char *, size_t);

static func_call_unchecked_fn func_call_unchecked;
static set_fuel_fn set_fuel;
static get_fuel_fn get_fuel;
static set_epoch_deadline_fn set_epoch_deadline;
static memory_data_fn memory_data;
static memory_data_size_fn memory_data_size;
static trap_new_fn trap_new;

/* What command() returns first: the call ran, or which step stopped it. */
enum { DONE = 0, ENGINE_FAILED = 1, BAD_BLOCK = 2, BAD_RESPONSE = 3 };

static void *as_pointer(PyObject *value) {
    return PyLong_AsVoidPtr(value);
}

/* bind(call, set_fuel, get_fuel, set_epoch_deadline, memory_data, memory_data_size, trap_new,
 *      raw_size) */
#define BOUND_FUNCTIONS 7
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != BOUND_FUNCTIONS + 1) {
        PyErr_SetString(PyExc_TypeError, "bind takes 8 arguments");
        return NULL;
    }
    Py_ssize_t raw_size = PyLong_AsSsize_t(args[BOUND_FUNCTIONS]);
    if (raw_size == -1 && PyErr_Occurred())
        return NULL;
    if (raw_size != (Py_ssize_t)sizeof(raw_val_t)) {
        PyErr_Format(PyExc_ValueError, "wasmtime_val_raw_t is %zd bytes, not %zu", raw_size,
                     sizeof(raw_val_t));
        return NULL;
    }
    void *found[BOUND_FUNCTIONS];
    for (int i = 0; i < BOUND_FUNCTIONS; i++) {
        found[i] = as_pointer(args[i]);
        if (found[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "function %d of bind is NULL", i);
            return NULL;
        }
    }
    func_call_unchecked = (func_call_unchecked_fn)found[0];
    set_fuel = (set_fuel_fn)found[1];
    get_fuel = (get_fuel_fn)found[2];
    set_epoch_deadline = (set_epoch_deadline_fn)found[3];
    memory_data = (memory_data_fn)found[4];
    memory_data_size = (memory_data_size_fn)found[5];
    trap_new = (trap_new_fn)found[6];
    Py_RETURN_NONE;
}

static wasmtime_error_t *cross(wasmtime_context_t *ctx, const wasmtime_func_t *func,
                               raw_val_t *values, size_t count, wasm_trap_t **trap, int keep_gil) {
    wasmtime_error_t *err;
    if (keep_gil) {
        err = func_call_unchecked(ctx, func, values, count, trap);
    } else {
        Py_BEGIN_ALLOW_THREADS
        err = func_call_unchecked(ctx, func, values, count, trap);
        Py_END_ALLOW_THREADS
    }
    return err;
}

static PyObject *answer(int code, PyObject *first, PyObject *second, uint64_t fuel_left) {
    if (first == NULL || second == NULL) {
        Py_XDECREF(first);
        Py_XDECREF(second);
        return NULL;
    }
    PyObject *left = PyLong_FromUnsignedLongLong(fuel_left);
    if (left == NULL) {
        Py_DECREF(first);
        Py_DECREF(second);
        return NULL;
    }
    PyObject *result = PyTuple_New(4);
    if (result == NULL) {
        Py_DECREF(first);
        Py_DECREF(second);
        Py_DECREF(left);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, PyLong_FromLong(code));
    PyTuple_SET_ITEM(result, 1, first);
    PyTuple_SET_ITEM(result, 2, second);
    PyTuple_SET_ITEM(result, 3, left);
    if (PyTuple_GET_ITEM(result, 0) == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* command(ctx, alloc, call, args1, args3, trap_slot, memory, fuel, keep_gil, name, payload,
 *         max_output)
 *
 * The addresses are those Instance holds (its Store's context, its wasmtime_func_t of
 * wasihost_alloc and wasihost_call, its 1- and 3-value arrays, its trap slot, its
 * wasmtime_memory_t); name is bytes, payload any contiguous buffer. Returns a 4-tuple, the
 * last item the fuel left as the Store counts it after the call:
 *   (DONE, status, body, left)             the answer: its status word and its body (bytes);
 *   (ENGINE_FAILED, error address, 0, left) a crossing returned an error or a trap (in the
 *                                           trap slot): Python turns it into the failure;
 *   (BAD_BLOCK, ptr, total, left)           wasihost_alloc's block is 0 or not inside memory;
 *   (BAD_RESPONSE, packed, 0, left)         the answer is outside memory, shorter than its
 *                                           status or over max_output.
 */
static PyObject *command(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "command takes 12 arguments");
        return NULL;
    }
    if (func_call_unchecked == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastcall.bind was not called");
        return NULL;
    }
    wasmtime_context_t *ctx = as_pointer(args[0]);
    const wasmtime_func_t *alloc = as_pointer(args[1]);
    const wasmtime_func_t *call = as_pointer(args[2]);
    raw_val_t *args1 = as_pointer(args[3]);
    raw_val_t *args3 = as_pointer(args[4]);
    wasm_trap_t **trap = as_pointer(args[5]);
    const wasmtime_memory_t *memory = as_pointer(args[6]);
    uint64_t fuel = PyLong_AsUnsignedLongLong(args[7]);
    int keep_gil = PyObject_IsTrue(args[8]);
    Py_ssize_t max_output = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred() || keep_gil < 0)
        return NULL;
    if (!ctx || !alloc || !call || !args1 || !args3 || !trap || !memory) {
        PyErr_SetString(PyExc_ValueError, "a NULL address");
        return NULL;
    }
    if (!PyBytes_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "the command name must be bytes");
        return NULL;
    }
    const char *name = PyBytes_AS_STRING(args[9]);
    Py_ssize_t name_len = PyBytes_GET_SIZE(args[9]);
    Py_buffer payload;
    if (PyObject_GetBuffer(args[10], &payload, PyBUF_SIMPLE) < 0)
        return NULL;

    PyObject *result = NULL;
    uint64_t left = 0;
    uint64_t total = (uint64_t)name_len + (uint64_t)payload.len;
    set_fuel(ctx, fuel);
    set_epoch_deadline(ctx, 1);
    /* -- alloc -- */
    memset(args1, 0, sizeof(raw_val_t));
    args1[0].i32 = (int32_t)(uint32_t)total;
    wasmtime_error_t *err = cross(ctx, alloc, args1, 1, trap, keep_gil);
    if (err != NULL || *trap != NULL) {
        get_fuel(ctx, &left);
        result = answer(ENGINE_FAILED, PyLong_FromVoidPtr(err), PyLong_FromLong(0), left);
        goto out;
    }
    uint64_t ptr = (uint32_t)args1[0].i32;
    uint8_t *base = memory_data(ctx, memory);
    uint64_t size = memory_data_size(ctx, memory);
    if (ptr == 0 || total > UINT32_MAX || ptr + total > size) {
        get_fuel(ctx, &left);
        result = answer(BAD_BLOCK, PyLong_FromUnsignedLongLong(ptr),
                        PyLong_FromUnsignedLongLong(total), left);
        goto out;
    }
    /* -- write -- the name, then the payload, in the guest's block */
    memcpy(base + ptr, name, (size_t)name_len);
    memcpy(base + ptr + name_len, payload.buf, (size_t)payload.len);
    /* -- run -- */
    memset(args3, 0, 3 * sizeof(raw_val_t));
    args3[0].i32 = (int32_t)(uint32_t)ptr;
    args3[1].i32 = (int32_t)(uint32_t)name_len;
    args3[2].i32 = (int32_t)(uint32_t)payload.len;
    err = cross(ctx, call, args3, 3, trap, keep_gil);
    get_fuel(ctx, &left);
    if (err != NULL || *trap != NULL) {
        result = answer(ENGINE_FAILED, PyLong_FromVoidPtr(err), PyLong_FromLong(0), left);
        goto out;
    }
    /* -- read -- the memory may have grown in the call: its size is read again (its base
     * never moves: the engine is configured with memory_may_move off) */
    uint64_t packed = (uint64_t)args3[0].i64;
    uint64_t resp_ptr = packed >> 32, resp_len = packed & UINT32_MAX;
    size = memory_data_size(ctx, memory);
    if (resp_ptr + resp_len > size || resp_len < 4 || resp_len - 4 > (uint64_t)max_output) {
        result = answer(BAD_RESPONSE, PyLong_FromUnsignedLongLong(packed), PyLong_FromLong(0),
                        left);
        goto out;
    }
    const uint8_t *at = base + resp_ptr;
    uint32_t status = (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 |
                      (uint32_t)at[3] << 24;
    result = answer(DONE, PyLong_FromUnsignedLong(status),
                    PyBytes_FromStringAndSize((const char *)at + 4, (Py_ssize_t)(resp_len - 4)),
                    left);
out:
    PyBuffer_Release(&payload);
    return result;
}

/* ---- host calls ----------------------------------------------------------------------- */

/* How many host calls this thread is inside: sigint.py asks (in_host_call) whether a signal
 * arrived while a guest's host call runs, which a native entry's handler frame does not show
 * (it has no frame of the engine's on the stack). */
static __thread long host_depth;

/* A host call that failed in a way no closure of the engine's could answer (an exception
 * escaped the dispatch, or a closure's answer was not an address): the exception goes to
 * sys.unraisablehook with the callable, which stops the instance (sigint.py), and the guest
 * gets a trap, so its call ends there. */
static wasm_trap_t *escaped(PyObject *where) {
    static const char message[] = "wasihost: host call failed";
    PyErr_WriteUnraisable(where);
    return trap_new(message, sizeof(message) - 1);
}

/* A closure's answer: the trap's address, or 0 to carry on. Consumes ``answer``. */
static wasm_trap_t *as_trap(PyObject *answer, PyObject *where) {
    if (answer == NULL)
        return escaped(where);
    void *trap = PyLong_AsVoidPtr(answer);
    Py_DECREF(answer);
    if (trap == NULL && PyErr_Occurred())
        return escaped(where);
    return (wasm_trap_t *)trap;
}

/* Calls ``fn(env, caller, args, nargs)``, a dispatch of the engine's. */
static wasm_trap_t *call_dispatch(PyObject *fn, void *env, void *caller, raw_val_t *args,
                                  size_t nargs) {
    PyObject *argv[4];
    argv[0] = PyLong_FromVoidPtr(env);
    argv[1] = PyLong_FromVoidPtr(caller);
    argv[2] = PyLong_FromVoidPtr(args);
    argv[3] = PyLong_FromSize_t(nargs);
    PyObject *answer = NULL;
    if (argv[0] && argv[1] && argv[2] && argv[3])
        answer = PyObject_Vectorcall(fn, argv, 4, NULL);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(argv[i]);
    return as_trap(answer, fn);
}

/* The wasmtime_func_unchecked_callback_t of every import without a native entry: ``env`` is
 * the import's dispatch (engine/hostcalls.py), which the Instance keeps alive as long as the
 * Store that calls it. */
static wasm_trap_t *host_trampoline(void *env, void *caller, raw_val_t *args, size_t nargs) {
    PyGILState_STATE gil = PyGILState_Ensure();
    host_depth++;
    wasm_trap_t *trap = call_dispatch((PyObject *)env, env, caller, args, nargs);
    host_depth--;
    PyGILState_Release(gil);
    return trap;
}

/* A native entry: the C half of one native import's dispatch (engine/native.py,
 * fast_native_entry), for an entry whose parameters are i32/i64 and whose result is at most
 * one i32/i64. The common call (not interrupted, granted, memory bound, the handler returns an
 * int, the fuel debt stays under SETTLE_FUEL) is served here; each other turn is handed to the
 * Python closure that serves it in the generic dispatch, so both paths decide alike. */
#define MAX_PARAMS 16
enum { R_NONE = 0, R_I32 = 1, R_I64 = 2 };

typedef struct {
    PyObject_HEAD
    PyObject *host_dict; /* the HostContext's __dict__: interrupted, halt, fuel_debt */
    PyObject *call;      /* its NativeCall: bound and moved, read by slot offset */
    Py_ssize_t bound_at, moved_at;
    PyObject *gate;      /* gate(entry) -> bool, or None for an ungated (core) entry */
    PyObject *entry;
    PyObject *handler;   /* handler(call, *ints) */
    PyObject *slow;      /* the generic dispatch(env, caller, args, nargs) of this import */
    PyObject *on_denied; /* on_denied(caller, args) -> trap: the gate said no */
    PyObject *on_raise;  /* on_raise(caller, exception) -> trap: the handler raised */
    PyObject *pay;       /* pay(caller) -> trap or 0: the price the C sum does not cover */
    PyObject *finish;    /* finish(args, result) -> trap or 0: a result that is not an int */
    long long base_price, per_byte, settle_at;
    int nparams;
    char params[MAX_PARAMS]; /* 'I' u32, 'i' i32, 'Q' u64, 'q' i64 */
    int result;
    /* The Instance holds its entries as long as its Store; a weak reference lets a test see
     * them go with it (tests/host/test_profiles.py). */
    PyObject *weakrefs;
} NativeEntry;

static PyObject *str_interrupted, *str_halt, *str_fuel_debt;

/* The exception being raised, taken (normalized, with its traceback): a new reference. */
static PyObject *take_exception(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value != NULL ? value : Py_NewRef(Py_None);
}

static int entry_traverse(NativeEntry *self, visitproc visit, void *arg) {
    Py_VISIT(self->host_dict);
    Py_VISIT(self->call);
    Py_VISIT(self->gate);
    Py_VISIT(self->entry);
    Py_VISIT(self->handler);
    Py_VISIT(self->slow);
    Py_VISIT(self->on_denied);
    Py_VISIT(self->on_raise);
    Py_VISIT(self->pay);
    Py_VISIT(self->finish);
    return 0;
}

static int entry_clear(NativeEntry *self) {
    Py_CLEAR(self->host_dict);
    Py_CLEAR(self->call);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->entry);
    Py_CLEAR(self->handler);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->on_denied);
    Py_CLEAR(self->on_raise);
    Py_CLEAR(self->pay);
    Py_CLEAR(self->finish);
    return 0;
}

static void entry_dealloc(NativeEntry *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The offset of ``name``, a __slots__ member of ``call``'s exact type holding an object. */
static Py_ssize_t slot_offset(PyObject *call, const char *name) {
    PyObject *descr = PyDict_GetItemString(Py_TYPE(call)->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s is not a slot of %s", name, Py_TYPE(call)->tp_name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s of %s is not a writable object slot", name,
                     Py_TYPE(call)->tp_name);
        return -1;
    }
    return member->offset;
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *host, *call, *gate, *entry, *handler, *slow, *on_denied, *on_raise, *pay, *finish;
    long long base_price, per_byte, settle_at;
    const char *params;
    Py_ssize_t nparams;
    int result;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "NativeEntry takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOLLLy#i:NativeEntry", &host, &call, &gate, &entry,
                          &handler, &slow, &on_denied, &on_raise, &pay, &finish, &base_price,
                          &per_byte, &settle_at, &params, &nparams, &result))
        return NULL;
    if (nparams > MAX_PARAMS || result < R_NONE || result > R_I64 || base_price < 0 ||
        per_byte < 0 || settle_at <= 0) {
        PyErr_SetString(PyExc_ValueError, "NativeEntry: a signature or price out of range");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nparams; i++) {
        if (strchr("IiQq", params[i]) == NULL || params[i] == 0) {
            PyErr_Format(PyExc_ValueError, "NativeEntry: parameter code %c", params[i]);
            return NULL;
        }
    }
    Py_ssize_t bound_at = slot_offset(call, "bound");
    Py_ssize_t moved_at = bound_at < 0 ? -1 : slot_offset(call, "moved");
    if (moved_at < 0)
        return NULL;
    PyObject *host_dict = PyObject_GenericGetDict(host, NULL);
    if (host_dict == NULL)
        return NULL;
    NativeEntry *self = (NativeEntry *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(host_dict);
        return NULL;
    }
    self->host_dict = host_dict;
    self->call = Py_NewRef(call);
    self->bound_at = bound_at;
    self->moved_at = moved_at;
    self->gate = gate == Py_None ? NULL : Py_NewRef(gate);
    self->entry = Py_NewRef(entry);
    self->handler = Py_NewRef(handler);
    self->slow = Py_NewRef(slow);
    self->on_denied = Py_NewRef(on_denied);
    self->on_raise = Py_NewRef(on_raise);
    self->pay = Py_NewRef(pay);
    self->finish = Py_NewRef(finish);
    self->base_price = base_price;
    self->per_byte = per_byte;
    self->settle_at = settle_at;
    self->nparams = (int)nparams;
    memcpy(self->params, params, (size_t)nparams);
    self->result = result;
    return (PyObject *)self;
}

static PyObject *slot_of(PyObject *obj, Py_ssize_t offset) {
    return *(PyObject **)((char *)obj + offset);
}

static PyObject *call2(PyObject *fn, PyObject *a, PyObject *b) {
    PyObject *argv[2] = {a, b};
    return PyObject_Vectorcall(fn, argv, 2, NULL);
}

/* One host call of a native entry: see NativeEntry. */
static wasm_trap_t *serve_native(NativeEntry *self, void *env, void *caller, raw_val_t *args,
                                 size_t nargs) {
    PyObject *interrupted = PyDict_GetItemWithError(self->host_dict, str_interrupted);
    if (interrupted == NULL)
        PyErr_Clear(); /* not there: the generic dispatch reads it, and answers what it finds */
    if (interrupted != Py_False || slot_of(self->call, self->bound_at) != Py_True)
        /* Stopped, not bound (a start function's call) or something odd: the generic way. */
        return call_dispatch(self->slow, env, caller, args, nargs);
    PyObject *caller_int = PyLong_FromVoidPtr(caller);
    if (caller_int == NULL)
        return escaped((PyObject *)self);
    wasm_trap_t *trap = NULL;
    if (self->gate != NULL) {
        PyObject *granted = PyObject_CallOneArg(self->gate, self->entry);
        int yes = granted == NULL ? -1 : granted == Py_True ? 1 : PyObject_IsTrue(granted);
        Py_XDECREF(granted);
        if (yes != 1) {
            if (yes < 0) { /* the gate raised: as the generic dispatch, the call ends */
                PyObject *exc = take_exception();
                trap = as_trap(call2(self->on_raise, caller_int, exc), self->on_raise);
                Py_DECREF(exc);
            } else {
                PyObject *args_int = PyLong_FromVoidPtr(args);
                trap = args_int == NULL
                           ? escaped((PyObject *)self)
                           : as_trap(call2(self->on_denied, caller_int, args_int),
                                     self->on_denied);
                Py_XDECREF(args_int);
            }
            Py_DECREF(caller_int);
            return trap;
        }
    }
    /* call.moved = 0 */
    PyObject **moved = (PyObject **)((char *)self->call + self->moved_at);
    PyObject *zero = PyLong_FromLong(0);
    Py_XSETREF(*moved, zero);
    /* handler(call, *ints) */
    PyObject *argv[MAX_PARAMS + 1];
    argv[0] = self->call;
    int made = 0;
    for (; made < self->nparams; made++) {
        raw_val_t *value = &args[made];
        PyObject *arg;
        switch (self->params[made]) {
        case 'I': arg = PyLong_FromUnsignedLong((uint32_t)value->i32); break;
        case 'i': arg = PyLong_FromLong(value->i32); break;
        case 'Q': arg = PyLong_FromUnsignedLongLong((uint64_t)value->i64); break;
        default: arg = PyLong_FromLongLong(value->i64); break;
        }
        if (arg == NULL)
            break;
        argv[made + 1] = arg;
    }
    PyObject *result = NULL;
    if (made == self->nparams)
        result = PyObject_Vectorcall(self->handler, argv, (size_t)made + 1, NULL);
    for (int i = 0; i < made; i++)
        Py_DECREF(argv[i + 1]);
    if (result == NULL) {
        PyObject *exc = take_exception();
        trap = as_trap(call2(self->on_raise, caller_int, exc), self->on_raise);
        Py_DECREF(exc);
        Py_DECREF(caller_int);
        return trap;
    }
    /* The price, after the handler (the bytes moved are known now): summed here while the
     * debt stays under SETTLE_FUEL and nothing asks to stop; else pay() does it all. */
    PyObject *halt = PyDict_GetItemWithError(self->host_dict, str_halt);
    PyObject *debt_now = PyDict_GetItemWithError(self->host_dict, str_fuel_debt);
    PyObject *moved_now = *moved;
    long long debt = -1;
    if (halt == Py_None && debt_now != NULL && PyLong_CheckExact(debt_now) && moved_now != NULL &&
        PyLong_CheckExact(moved_now)) {
        int over_a = 0, over_b = 0;
        long long owed = PyLong_AsLongLongAndOverflow(debt_now, &over_a);
        long long bytes = PyLong_AsLongLongAndOverflow(moved_now, &over_b);
        long long price;
        if (!over_a && !over_b && owed >= 0 && bytes >= 0 &&
            !__builtin_mul_overflow(bytes, self->per_byte, &price) &&
            !__builtin_add_overflow(price, self->base_price, &price) &&
            !__builtin_add_overflow(price, owed, &debt) && debt < self->settle_at) {
            PyObject *sum = PyLong_FromLongLong(debt);
            if (sum == NULL || PyDict_SetItem(self->host_dict, str_fuel_debt, sum) < 0)
                debt = -1;
            Py_XDECREF(sum);
        } else {
            debt = -1;
        }
    }
    if (PyErr_Occurred()) {
        PyErr_Clear(); /* pay() reads the same values again, and answers what it finds */
        debt = -1;
    }
    if (debt < 0) {
        trap = as_trap(PyObject_CallOneArg(self->pay, caller_int), self->pay);
        if (trap != NULL) {
            Py_DECREF(result);
            Py_DECREF(caller_int);
            return trap;
        }
    }
    Py_DECREF(caller_int);
    /* The result, into slot 0 of the array (masked to its width, as the generic dispatch). */
    if (self->result != R_NONE) {
        if (PyLong_Check(result) && nargs >= 1) {
            unsigned long long bits = PyLong_AsUnsignedLongLongMask(result);
            memset(&args[0], 0, sizeof(raw_val_t));
            if (self->result == R_I32)
                args[0].i32 = (int32_t)(uint32_t)bits;
            else
                args[0].i64 = (int64_t)bits;
        } else { /* a float, an object with __index__, nothing: the dispatch's own writer */
            PyObject *args_int = PyLong_FromVoidPtr(args);
            trap = args_int == NULL
                       ? escaped((PyObject *)self)
                       : as_trap(call2(self->finish, args_int, result), self->finish);
            Py_XDECREF(args_int);
        }
    }
    Py_DECREF(result);
    return trap;
}

/* The wasmtime_func_unchecked_callback_t of every import with a native entry (``env``). */
static wasm_trap_t *native_trampoline(void *env, void *caller, raw_val_t *args, size_t nargs) {
    PyGILState_STATE gil = PyGILState_Ensure();
    host_depth++;
    wasm_trap_t *trap = serve_native((NativeEntry *)env, env, caller, args, nargs);
    host_depth--;
    PyGILState_Release(gil);
    return trap;
}

/* entry(caller, args, nargs): the same call from Python, for the differential tests. */
static PyObject *entry_call(PyObject *self, PyObject *args_tuple, PyObject *kwargs) {
    PyObject *caller_int, *args_int;
    Py_ssize_t nargs;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "a native entry takes positional arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args_tuple, "OOn:NativeEntry", &caller_int, &args_int, &nargs))
        return NULL;
    void *caller = PyLong_AsVoidPtr(caller_int);
    void *args = PyLong_AsVoidPtr(args_int);
    if (PyErr_Occurred())
        return NULL;
    if (args == NULL || nargs < 0) {
        PyErr_SetString(PyExc_ValueError, "a native entry needs its argument array");
        return NULL;
    }
    host_depth++;
    wasm_trap_t *trap = serve_native((NativeEntry *)self, self, caller, args, (size_t)nargs);
    host_depth--;
    if (PyErr_Occurred()) /* reported as unraisable already; the trap says it */
        PyErr_Clear();
    return PyLong_FromVoidPtr(trap);
}

static PyMemberDef entry_members[] = {
    {"entry", T_OBJECT, offsetof(NativeEntry, entry), READONLY, "the registry entry"},
    {NULL},
};

static PyTypeObject NativeEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wasihost.engine._fastcall.NativeEntry",
    .tp_basicsize = sizeof(NativeEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "NativeEntry(host, call, gate, entry, handler, slow, on_denied, on_raise, pay, "
              "finish, base_price, per_byte, settle_at, params, result): one native import "
              "served from C (engine/native.py, fast_native_entry)",
    .tp_new = entry_new,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_call = entry_call,
    .tp_members = entry_members,
    .tp_weaklistoffset = offsetof(NativeEntry, weakrefs),
};


/* ---- quick hand-overs between threads ------------------------------------------------- */

static uint64_t now_ns(void) {
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    return (uint64_t)at.tv_sec * 1000000000u + (uint64_t)at.tv_nsec;
}

/* wait_flag(flag, ns, signal=None) -> bool
 *
 * Waits, without the GIL, up to ``ns`` nanoseconds for byte 0 of ``flag`` (a bytearray) to
 * become nonzero, yielding the CPU between looks; answers whether it did. ``signal``, a
 * bytearray too, gets its byte 0 set once the GIL is released: a thread handing an outcome to
 * another that waits here sets it this way, so the other finds the GIL free when it sees the
 * flag instead of sleeping on it (docs/engine.md "The acall hand-over"). A hand-over between
 * two threads that each sleep costs two wake-ups of tens of microseconds; this costs a few. */
static PyObject *wait_flag(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "wait_flag takes (flag, ns, signal=None)");
        return NULL;
    }
    if (!PyByteArray_CheckExact(args[0]) || PyByteArray_GET_SIZE(args[0]) < 1) {
        PyErr_SetString(PyExc_TypeError, "the flag must be a non-empty bytearray");
        return NULL;
    }
    PyObject *signal_obj = nargs == 3 ? args[2] : Py_None;
    if (signal_obj != Py_None &&
        (!PyByteArray_CheckExact(signal_obj) || PyByteArray_GET_SIZE(signal_obj) < 1)) {
        PyErr_SetString(PyExc_TypeError, "the signal must be a non-empty bytearray or None");
        return NULL;
    }
    long long ns = PyLong_AsLongLong(args[1]);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    if (ns < 0 || ns > 1000000000LL) {
        PyErr_SetString(PyExc_ValueError, "wait_flag waits 0..1 s");
        return NULL;
    }
    /* Both stay alive (the caller holds them) and cannot be resized while this runs: they are
     * only ever written one byte at a time, in place. */
    volatile char *flag = PyByteArray_AS_STRING(args[0]);
    volatile char *to_signal = signal_obj == Py_None ? NULL : PyByteArray_AS_STRING(signal_obj);
    int seen;
    Py_BEGIN_ALLOW_THREADS
    if (to_signal != NULL) {
        __atomic_store_n(to_signal, 1, __ATOMIC_RELEASE);
    }
    uint64_t until = now_ns() + (uint64_t)ns;
    for (;;) {
        seen = __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
        if (seen || now_ns() >= until)
            break;
        sched_yield();
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(seen);
}

static PyObject *in_host_call(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(host_depth > 0);
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(call, set_fuel, get_fuel, set_epoch_deadline, memory_data, memory_data_size, "
     "trap_new, raw_size): the libwasmtime functions this module calls"},
    {"command", (PyCFunction)(void (*)(void))command, METH_FASTCALL,
     "command(ctx, alloc, call, args1, args3, trap_slot, memory, fuel, keep_gil, name, "
     "payload, max_output) -> (code, a, b, fuel_left): one ABI command call"},
    {"wait_flag", (PyCFunction)(void (*)(void))wait_flag, METH_FASTCALL,
     "wait_flag(flag, ns, signal=None) -> bool: wait without the GIL for flag[0] to be set"},
    {"in_host_call", in_host_call, METH_NOARGS,
     "in_host_call() -> bool: whether this thread is inside a guest's host call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wasihost.engine._fastcall",
    "One ABI command call as one crossing into libwasmtime (engine/fastcall.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(m, "ENGINE_FAILED", ENGINE_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "BAD_BLOCK", BAD_BLOCK) < 0 ||
        PyModule_AddIntConstant(m, "BAD_RESPONSE", BAD_RESPONSE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    str_interrupted = PyUnicode_InternFromString("interrupted");
    str_halt = PyUnicode_InternFromString("halt");
    str_fuel_debt = PyUnicode_InternFromString("fuel_debt");
    PyObject *host = PyLong_FromVoidPtr((void *)host_trampoline);
    PyObject *native = PyLong_FromVoidPtr((void *)native_trampoline);
    if (!str_interrupted || !str_halt || !str_fuel_debt || !host || !native ||
        PyModule_AddObjectRef(m, "HOST_TRAMPOLINE", host) < 0 ||
        PyModule_AddObjectRef(m, "NATIVE_TRAMPOLINE", native) < 0 ||
        PyType_Ready(&NativeEntryType) < 0 ||
        PyModule_AddObjectRef(m, "NativeEntry", (PyObject *)&NativeEntryType) < 0) {
        Py_XDECREF(host);
        Py_XDECREF(native);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(host);
    Py_DECREF(native);
    return m;
}
