/* The `pulsar` Spark source's read loop in C (spark_bridge/native.py).
 *
 * Python's per-message calls (read, id, two comparisons, six fields) cost more than the read itself
 * and hold the GIL; here a chunk of a (start, end] range is read with the GIL released into column
 * buffers that pyarrow wraps without a Python object per message. It uses Pulsar's C API from the
 * libpulsar that pulsar-client ships (resolved at run time with dlopen: nothing to link at build
 * time), with a client of its own. Ids compare as (ledger, entry, batch index), decoded from their
 * serialized MessageIdData, which is also the messageId column.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BATCH_END 2147483647LL
#define RESULT_OK 0
#define RESULT_TIMEOUT 3
#define LOG_ERROR 3

typedef void (*logger_fn)(int level, const char *file, int line, const char *message, void *ctx);

static struct {
    void *(*conf_create)(void);
    void (*conf_free)(void *);
    void (*conf_set_auth)(void *, void *);
    void (*conf_set_op_timeout)(void *, int);
    void (*conf_set_logger)(void *, logger_fn, void *);
    void (*conf_set_trust)(void *, const char *);
    void (*conf_set_insecure)(void *, int);
    void (*conf_set_validate_hostname)(void *, int);
    void *(*token_create)(const char *);
    void (*auth_free)(void *);
    void *(*client_create)(const char *, const void *);
    int (*client_close)(void *);
    void (*client_free)(void *);
    void *(*reader_conf_create)(void);
    void (*reader_conf_free)(void *);
    void (*reader_conf_set_queue)(void *, int);
    int (*create_reader)(void *, const char *, const void *, void *, void **);
    int (*read_next)(void *, void **, int);
    int (*reader_close)(void *);
    void (*reader_free)(void *);
    void *(*msg_id_earliest)(void);
    void *(*msg_id_deserialize)(const void *, uint32_t);
    void *(*msg_id_serialize)(void *, int *);
    void (*msg_id_free)(void *);
    void *(*msg_get_id)(void *);
    const void *(*msg_data)(void *);
    uint32_t (*msg_length)(void *);
    const char *(*msg_key)(void *);
    uint64_t (*msg_publish)(void *);
    uint64_t (*msg_event)(void *);
    void *(*msg_properties)(void *);
    void (*msg_free)(void *);
    int (*map_size)(void *);
    const char *(*map_key)(void *, int);
    const char *(*map_value)(void *, int);
    void (*map_free)(void *);
    const char *(*result_str)(int);
} api;
static int api_loaded = 0;

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (api_loaded) Py_RETURN_NONE;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
    struct { void **slot; const char *name; } syms[] = {
        {(void **)&api.conf_create, "pulsar_client_configuration_create"},
        {(void **)&api.conf_free, "pulsar_client_configuration_free"},
        {(void **)&api.conf_set_auth, "pulsar_client_configuration_set_auth"},
        {(void **)&api.conf_set_op_timeout, "pulsar_client_configuration_set_operation_timeout_seconds"},
        {(void **)&api.conf_set_logger, "pulsar_client_configuration_set_logger"},
        {(void **)&api.conf_set_trust, "pulsar_client_configuration_set_tls_trust_certs_file_path"},
        {(void **)&api.conf_set_insecure, "pulsar_client_configuration_set_tls_allow_insecure_connection"},
        {(void **)&api.conf_set_validate_hostname, "pulsar_client_configuration_set_validate_hostname"},
        {(void **)&api.token_create, "pulsar_authentication_token_create"},
        {(void **)&api.auth_free, "pulsar_authentication_free"},
        {(void **)&api.client_create, "pulsar_client_create"},
        {(void **)&api.client_close, "pulsar_client_close"},
        {(void **)&api.client_free, "pulsar_client_free"},
        {(void **)&api.reader_conf_create, "pulsar_reader_configuration_create"},
        {(void **)&api.reader_conf_free, "pulsar_reader_configuration_free"},
        {(void **)&api.reader_conf_set_queue, "pulsar_reader_configuration_set_receiver_queue_size"},
        {(void **)&api.create_reader, "pulsar_client_create_reader"},
        {(void **)&api.read_next, "pulsar_reader_read_next_with_timeout"},
        {(void **)&api.reader_close, "pulsar_reader_close"},
        {(void **)&api.reader_free, "pulsar_reader_free"},
        {(void **)&api.msg_id_earliest, "pulsar_message_id_earliest"},
        {(void **)&api.msg_id_deserialize, "pulsar_message_id_deserialize"},
        {(void **)&api.msg_id_serialize, "pulsar_message_id_serialize"},
        {(void **)&api.msg_id_free, "pulsar_message_id_free"},
        {(void **)&api.msg_get_id, "pulsar_message_get_message_id"},
        {(void **)&api.msg_data, "pulsar_message_get_data"},
        {(void **)&api.msg_length, "pulsar_message_get_length"},
        {(void **)&api.msg_key, "pulsar_message_get_partitionKey"},
        {(void **)&api.msg_publish, "pulsar_message_get_publish_timestamp"},
        {(void **)&api.msg_event, "pulsar_message_get_event_timestamp"},
        {(void **)&api.msg_properties, "pulsar_message_get_properties"},
        {(void **)&api.msg_free, "pulsar_message_free"},
        {(void **)&api.map_size, "pulsar_string_map_size"},
        {(void **)&api.map_key, "pulsar_string_map_get_key"},
        {(void **)&api.map_value, "pulsar_string_map_get_value"},
        {(void **)&api.map_free, "pulsar_string_map_free"},
        {(void **)&api.result_str, "pulsar_result_str"},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) return PyErr_Format(PyExc_OSError, "%s has no %s", path, syms[i].name);
    }
    api_loaded = 1;
    Py_RETURN_NONE;
}

/* Pulsar's client logs through this: errors to stderr, like the Python client at its Error level. */
static void log_errors(int level, const char *file, int line, const char *message, void *ctx) {
    if (level >= LOG_ERROR) fprintf(stderr, "pulsar native reader: %s:%d %s\n", file, line, message);
}

/* --- message ids ------------------------------------------------------------------------------- */

typedef struct { int64_t ledger, entry, batch, batch_size; } Pos;

static int varint(const unsigned char *p, int n, int *i, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; *i < n && shift < 64; shift += 7) {
        unsigned char b = p[(*i)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) { *out = v; return 0; }
    }
    return -1;
}

/* (ledger, entry, batch index, batch size) of a serialized MessageIdData; -1 where absent. */
static int decode_id(const unsigned char *p, int n, Pos *pos) {
    pos->ledger = pos->entry = pos->batch = pos->batch_size = -1;
    int i = 0;
    while (i < n) {
        uint64_t tag, v;
        if (varint(p, n, &i, &tag)) return -1;
        switch (tag & 7) {
        case 0:
            if (varint(p, n, &i, &v)) return -1;
            switch (tag >> 3) {
            case 1: pos->ledger = (int64_t)v; break;
            case 2: pos->entry = (int64_t)v; break;
            case 4: pos->batch = (int32_t)v; break;
            case 6: pos->batch_size = (int32_t)v; break;
            }
            break;
        case 1: i += 8; break;
        case 2: if (varint(p, n, &i, &v) || v > (uint64_t)(n - i)) return -1; i += (int)v; break;
        case 5: i += 4; break;
        default: return -1;
        }
    }
    return i == n ? 0 : -1;
}

static int cmp(const Pos *a, const Pos *b) {
    if (a->ledger != b->ledger) return a->ledger < b->ledger ? -1 : 1;
    if (a->entry != b->entry) return a->entry < b->entry ? -1 : 1;
    if (a->batch != b->batch) return a->batch < b->batch ? -1 : 1;
    return 0;
}

/* offsets.Position.of: the last message of an entry stands for the entry's end. */
static Pos canonical(const Pos *p) {
    Pos c = *p;
    if (c.batch < 0 || c.batch == c.batch_size - 1) c.batch = BATCH_END;
    return c;
}

/* --- growable buffers ---------------------------------------------------------------------------- */

typedef struct { char *data; size_t len, cap; } Buf;

static int put(Buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) return -1;
        b->data = data;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static int put_i32(Buf *b, int32_t v) { return put(b, &v, sizeof v); }
static int put_i64(Buf *b, int64_t v) { return put(b, &v, sizeof v); }

static int set_bit(Buf *bits, int64_t i, int on) {
    if (i % 8 == 0 && put(bits, "\0", 1)) return -1;
    if (on) bits->data[i / 8] |= (char)(1 << (i % 8));
    return 0;
}

/* An Arrow variable-size column: offsets (int32) and bytes; the offsets start at 0. */
typedef struct { Buf offsets, data; } VarCol;

static int var_add(VarCol *c, const void *src, size_t n) {
    if (c->offsets.len == 0 && put_i32(&c->offsets, 0)) return -1;
    if (put(&c->data, src, n) || c->data.len > INT32_MAX) return -1;
    return put_i32(&c->offsets, (int32_t)c->data.len);
}

static int var_init(VarCol *c) { return c->offsets.len == 0 ? put_i32(&c->offsets, 0) : 0; }

/* --- the reader -------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    void *client, *reader;
    Pos last, end, tail;
    int done;
} Reader;

static void close_reader(Reader *r) {
    if (r->reader) { api.reader_close(r->reader); api.reader_free(r->reader); r->reader = NULL; }
    if (r->client) { api.client_close(r->client); api.client_free(r->client); r->client = NULL; }
}

static void Reader_dealloc(Reader *r) {
    Py_BEGIN_ALLOW_THREADS
    close_reader(r);
    Py_END_ALLOW_THREADS
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int parse_pos(PyObject *t, Pos *p) {
    long long l, e, b;
    if (!PyArg_ParseTuple(t, "LLL", &l, &e, &b)) return -1;
    p->ledger = l; p->entry = e; p->batch = b; p->batch_size = -1;
    return 0;
}

/* Reader(service_url, topic, start_id_bytes or None (earliest), last (l, e, b), end (l, e, b), queue,
 *        operation_timeout_s, token or None, trust_file or None, allow_insecure, validate_hostname) */
static int Reader_init(Reader *r, PyObject *args, PyObject *kw) {
    const char *url, *topic, *token, *trust;
    Py_buffer start = {0};
    PyObject *last, *end;
    int queue, timeout_s, insecure, validate;
    if (!api_loaded) { PyErr_SetString(PyExc_RuntimeError, "load() the Pulsar C API first"); return -1; }
    if (!PyArg_ParseTuple(args, "ssz*OOiizzpp", &url, &topic, &start, &last, &end, &queue, &timeout_s, &token,
                          &trust, &insecure, &validate))
        return -1;
    int bad = parse_pos(last, &r->last) || parse_pos(end, &r->end);
    if (bad) { PyBuffer_Release(&start); return -1; }
    r->tail = r->end;
    if (r->end.batch == BATCH_END) r->tail.batch = -1;  /* the end's entry starts the tail */
    int result = RESULT_OK;
    const char *failed = NULL;
    Py_BEGIN_ALLOW_THREADS
    void *conf = api.conf_create(), *auth = token ? api.token_create(token) : NULL;
    api.conf_set_op_timeout(conf, timeout_s);
    api.conf_set_logger(conf, log_errors, NULL);
    if (auth) api.conf_set_auth(conf, auth);
    if (trust) api.conf_set_trust(conf, trust);
    api.conf_set_insecure(conf, insecure);
    api.conf_set_validate_hostname(conf, validate);
    r->client = api.client_create(url, conf);
    api.conf_free(conf);
    if (!r->client) {
        failed = "creating the client";
    } else {
        void *rconf = api.reader_conf_create();
        api.reader_conf_set_queue(rconf, queue);
        void *id = start.buf ? api.msg_id_deserialize(start.buf, (uint32_t)start.len) : api.msg_id_earliest();
        result = api.create_reader(r->client, topic, id, rconf, &r->reader);
        if (start.buf) api.msg_id_free(id);
        api.reader_conf_free(rconf);
        if (result != RESULT_OK) { r->reader = NULL; close_reader(r); failed = "creating a reader"; }
    }
    if (auth) api.auth_free(auth);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&start);
    if (failed) {
        PyErr_Format(PyExc_ConnectionError, "%s for %s at %s: %s", failed, topic, url,
                     result != RESULT_OK ? api.result_str(result) : "invalid settings");
        return -1;
    }
    return 0;
}

typedef struct {
    VarCol keys, values, ids, prop_keys, prop_values;
    Buf key_valid, publish, event, event_valid, prop_offsets;
    int64_t n;
} Chunk;

static void chunk_free(Chunk *c) {
    Buf *bufs[] = {&c->keys.offsets, &c->keys.data, &c->values.offsets, &c->values.data, &c->ids.offsets,
                   &c->ids.data, &c->prop_keys.offsets, &c->prop_keys.data, &c->prop_values.offsets,
                   &c->prop_values.data, &c->key_valid, &c->publish, &c->event, &c->event_valid,
                   &c->prop_offsets};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]->data);
}

/* One message's fields onto the chunk; -1: out of memory. */
static int add_message(Chunk *c, void *msg, const void *id, int id_len) {
    const char *key = api.msg_key(msg);
    size_t key_len = key ? strlen(key) : 0;
    uint64_t event = api.msg_event(msg);
    void *props = api.msg_properties(msg);
    int bad = set_bit(&c->key_valid, c->n, key_len > 0) || var_add(&c->keys, key, key_len)
              || var_add(&c->values, api.msg_data(msg), api.msg_length(msg)) || var_add(&c->ids, id, id_len)
              || put_i64(&c->publish, (int64_t)api.msg_publish(msg)) || set_bit(&c->event_valid, c->n, event != 0)
              || put_i64(&c->event, (int64_t)event);
    int count = props ? api.map_size(props) : 0;
    for (int i = 0; !bad && i < count; i++) {
        const char *k = api.map_key(props, i), *v = api.map_value(props, i);
        bad = var_add(&c->prop_keys, k, strlen(k)) || var_add(&c->prop_values, v, strlen(v));
    }
    if (props) api.map_free(props);
    bad = bad || put_i32(&c->prop_offsets, (int32_t)(c->prop_keys.offsets.len / 4 - 1));
    c->n++;
    return bad ? -1 : 0;
}

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len); }

/* read(max_rows, wait_ms) -> (status, n, buffers...): status 0 more to read, 1 the range is done,
 * 2 nothing came for wait_ms (the caller reopens or gives up). */
static PyObject *Reader_read(Reader *r, PyObject *args) {
    int max_rows, wait_ms;
    if (!PyArg_ParseTuple(args, "ii", &max_rows, &wait_ms)) return NULL;
    if (!r->reader) return PyErr_Format(PyExc_RuntimeError, "the reader is closed");
    Chunk c;
    memset(&c, 0, sizeof c);
    int status = r->done ? 1 : 0, result = RESULT_OK, oom = 0;
    Py_BEGIN_ALLOW_THREADS
    oom = var_init(&c.keys) || var_init(&c.values) || var_init(&c.ids) || var_init(&c.prop_keys)
          || var_init(&c.prop_values) || put_i32(&c.prop_offsets, 0);
    while (!oom && status == 0 && c.n < max_rows) {
        void *msg = NULL;
        result = api.read_next(r->reader, &msg, wait_ms);
        if (result == RESULT_TIMEOUT) { status = 2; break; }
        if (result != RESULT_OK) break;
        void *mid = api.msg_get_id(msg);
        int id_len = 0;
        unsigned char *id = api.msg_id_serialize(mid, &id_len);
        api.msg_id_free(mid);
        Pos pos;
        if (!id || decode_id(id, id_len, &pos)) { free(id); api.msg_free(msg); result = -1; break; }
        if (cmp(&r->last, &pos) < 0) {  /* else before the range, or a duplicate delivery (B1) */
            int in_tail = cmp(&pos, &r->tail) >= 0;
            if (in_tail && cmp(&r->end, &pos) < 0) {
                status = 1;
            } else {
                r->last = pos;
                oom = add_message(&c, msg, id, id_len);
                Pos canon = canonical(&pos);
                if (in_tail && cmp(&canon, &r->end) >= 0) status = 1;
            }
        }
        free(id);
        api.msg_free(msg);
    }
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (oom) {
        PyErr_NoMemory();
    } else if (result != RESULT_OK && result != RESULT_TIMEOUT) {
        PyErr_Format(PyExc_ConnectionError, "reading: %s", result == -1 ? "an undecodable message id"
                                                                         : api.result_str(result));
    } else {
        if (status == 1) r->done = 1;
        out = Py_BuildValue("iLNNNNNNNNNNNNNNN", status, (long long)c.n, bytes_of(&c.key_valid),
                            bytes_of(&c.keys.offsets), bytes_of(&c.keys.data), bytes_of(&c.values.offsets),
                            bytes_of(&c.values.data), bytes_of(&c.ids.offsets), bytes_of(&c.ids.data),
                            bytes_of(&c.publish), bytes_of(&c.event_valid), bytes_of(&c.event),
                            bytes_of(&c.prop_offsets), bytes_of(&c.prop_keys.offsets), bytes_of(&c.prop_keys.data),
                            bytes_of(&c.prop_values.offsets), bytes_of(&c.prop_values.data));
    }
    chunk_free(&c);
    return out;
}

static PyObject *Reader_last(Reader *r, PyObject *unused) {
    return Py_BuildValue("LLL", (long long)r->last.ledger, (long long)r->last.entry, (long long)r->last.batch);
}

static PyObject *Reader_close(Reader *r, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    close_reader(r);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)Reader_read, METH_VARARGS, "Up to max_rows messages of the range as column buffers."},
    {"last", (PyCFunction)Reader_last, METH_NOARGS, "(ledger, entry, batch) of the last message read."},
    {"close", (PyCFunction)Reader_close, METH_NOARGS, "Close the reader and its client."},
    {NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pulsar_autoscale.spark_bridge._native_reader.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_doc = "A Pulsar Reader over one (start, end] range, read a chunk at a time without the GIL.",
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "Resolve Pulsar's C API in the given libpulsar."},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_reader", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__native_reader(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) { Py_DECREF(&ReaderType); Py_DECREF(m); return NULL; }
    return m;
}
