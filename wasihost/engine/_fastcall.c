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
 * it, PyDLL keeps it). Host functions re-enter Python through wasmtime-py's ctypes callbacks,
 * which take the GIL themselves.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

static func_call_unchecked_fn func_call_unchecked;
static set_fuel_fn set_fuel;
static get_fuel_fn get_fuel;
static set_epoch_deadline_fn set_epoch_deadline;
static memory_data_fn memory_data;
static memory_data_size_fn memory_data_size;

/* What command() returns first: the call ran, or which step stopped it. */
enum { DONE = 0, ENGINE_FAILED = 1, BAD_BLOCK = 2, BAD_RESPONSE = 3 };

static void *as_pointer(PyObject *value) {
    return PyLong_AsVoidPtr(value);
}

/* bind(call, set_fuel, get_fuel, set_epoch_deadline, memory_data, memory_data_size, raw_size) */
static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "bind takes 7 arguments");
        return NULL;
    }
    Py_ssize_t raw_size = PyLong_AsSsize_t(args[6]);
    if (raw_size == -1 && PyErr_Occurred())
        return NULL;
    if (raw_size != (Py_ssize_t)sizeof(raw_val_t)) {
        PyErr_Format(PyExc_ValueError, "wasmtime_val_raw_t is %zd bytes, not %zu", raw_size,
                     sizeof(raw_val_t));
        return NULL;
    }
    void *found[6];
    for (int i = 0; i < 6; i++) {
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

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(call, set_fuel, get_fuel, set_epoch_deadline, memory_data, memory_data_size, "
     "raw_size): the libwasmtime functions this module calls"},
    {"command", (PyCFunction)(void (*)(void))command, METH_FASTCALL,
     "command(ctx, alloc, call, args1, args3, trap_slot, memory, fuel, keep_gil, name, "
     "payload, max_output) -> (code, a, b, fuel_left): one ABI command call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wasihost.engine._fastcall",
    "One ABI command call as one crossing into libwasmtime (engine/fastcall.py).", -1, methods,
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
    return m;
}
