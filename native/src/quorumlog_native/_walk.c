/* quorumlog's loops over many entries a call (see __init__.py for the contracts).
 *
 * Each function replaces a Python loop that did a struct unpack, two CRC32C
 * calls and a few comparisons per entry: at 100-byte entries the interpreter's
 * overhead was ~0.5 us an entry, the CRC itself a few nanoseconds.
 *
 * CRC32C (Castagnoli, reflected 0x82F63B78) with the crc32c package's
 * convention: crc32c(data, value) continues from a previous result ``value``.
 * SSE4.2's crc32 instruction where the CPU has it (checked once at import),
 * slicing-by-8 tables otherwise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ CRC32C */

static uint32_t crc_table[8][256];
static int have_sse42 = 0;

static void
crc_init_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][n] = c;
        }
    }
}

static uint32_t
crc_soft(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        word ^= crc;
        crc = crc_table[7][word & 0xff] ^ crc_table[6][(word >> 8) & 0xff]
            ^ crc_table[5][(word >> 16) & 0xff] ^ crc_table[4][(word >> 24) & 0xff]
            ^ crc_table[3][(word >> 32) & 0xff] ^ crc_table[2][(word >> 40) & 0xff]
            ^ crc_table[1][(word >> 48) & 0xff] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QL_X86 1
__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

/* crc32c(data, value): the crc32c package's function. */
static inline uint32_t
crc32c_extend(uint32_t value, const unsigned char *p, size_t n)
{
    uint32_t crc = ~value;
#ifdef QL_X86
    if (have_sse42)
        return ~crc_hw(crc, p, n);
#endif
    return ~crc_soft(crc, p, n);
}

/* Unsigned integers stored big-endian (envelopes, frames) or little-endian
 * (stream entries) at p. */
static inline uint64_t
load64(const unsigned char *p, int big_endian)
{
    uint64_t v;
    memcpy(&v, p, 8);
    if (big_endian == (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__))
        v = __builtin_bswap64(v);
    return v;
}

static inline uint32_t
load32(const unsigned char *p, int big_endian)
{
    uint32_t v;
    memcpy(&v, p, 4);
    if (big_endian == (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__))
        v = __builtin_bswap32(v);
    return v;
}

#define be64(p) load64((p), 1)
#define be32(p) load32((p), 1)
#define le64(p) load64((p), 0)
#define le32(p) load32((p), 0)

/* ---------------------------------------------------------- the envelope */

/* header >QQqIB: ledger u64, entry u64, lac i64, length u32, digest code u8;
 * then the CRC32C (u32) of header + payload; then the payload. */
#define ENV_HEADER 29
#define ENV_START 33
#define CRC32C_CODE 1

/* The envelope at p (size bytes) is entry `entry_id` of `ledger_id`, CRC32C,
 * and checks out: its LAC, else INT64_MIN. */
static inline int64_t
envelope_lac(const unsigned char *p, Py_ssize_t size, uint64_t ledger_id, uint64_t entry_id)
{
    if (size < ENV_START)
        return INT64_MIN;
    int64_t lac = (int64_t)be64(p + 16);
    if (be64(p) != ledger_id || be64(p + 8) != entry_id || p[28] != CRC32C_CODE
            || lac < -1 || (Py_ssize_t)be32(p + 24) != size - ENV_START)
        return INT64_MIN;
    uint32_t crc = crc32c_extend(crc32c_extend(0, p, ENV_HEADER), p + ENV_START,
                                 (size_t)(size - ENV_START));
    return crc == be32(p + ENV_HEADER) ? lac : INT64_MIN;
}

static int
get_u64(PyObject *obj, uint64_t *out, const char *name)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s must be an int in [0, 2**64)", name);
        return -1;
    }
    *out = v;
    return 0;
}

/* The longest valid prefix of envelopes back to back (sizes[i] bytes each):
 * writes their payload bounds, returns how many. */
static Py_ssize_t
walk_envelopes(const unsigned char *base, Py_ssize_t total, const Py_ssize_t *sizes,
               Py_ssize_t n, uint64_t ledger_id, uint64_t entry_id, int64_t *out_starts,
               int64_t *out_ends, long long *payload_out)
{
    Py_ssize_t position = 0, count = 0;
    long long payload = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = sizes[i];
        if (size < ENV_START || size > total - position)
            break;
        if (envelope_lac(base + position, size, ledger_id, entry_id) == INT64_MIN)
            break;
        out_starts[count] = position + ENV_START;
        out_ends[count] = position + size;
        payload += size - ENV_START;
        count++;
        position += size;
        entry_id++;
    }
    *payload_out = payload;
    return count;
}

PyDoc_STRVAR(envelope_bounds_doc,
"envelope_bounds(buffer, sizes, ledger_id, first_entry_id, starts, ends) -> (count, payload_bytes)\n\n"
"Check CRC32C envelopes back to back in buffer (sizes[i] bytes each) as entries\n"
"first_entry_id, first_entry_id + 1, ... of ledger_id; write the payload bounds of\n"
"the longest valid prefix into starts and ends (writable int64 buffers of at least\n"
"len(sizes) items).");

static PyObject *
envelope_bounds(PyObject *self, PyObject *args)
{
    PyObject *buffer_obj, *sizes_obj, *ledger_obj, *first_obj, *starts_obj, *ends_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:envelope_bounds", &buffer_obj, &sizes_obj, &ledger_obj,
                          &first_obj, &starts_obj, &ends_obj))
        return NULL;
    uint64_t ledger_id, entry_id;
    if (get_u64(ledger_obj, &ledger_id, "ledger_id") < 0
            || get_u64(first_obj, &entry_id, "first_entry_id") < 0)
        return NULL;
    PyObject *sizes = PySequence_Fast(sizes_obj, "sizes must be a sequence of ints");
    if (sizes == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sizes);
    Py_buffer buf, starts, ends;
    if (PyObject_GetBuffer(buffer_obj, &buf, PyBUF_SIMPLE) < 0) {
        Py_DECREF(sizes);
        return NULL;
    }
    if (PyObject_GetBuffer(starts_obj, &starts, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&buf);
        Py_DECREF(sizes);
        return NULL;
    }
    if (PyObject_GetBuffer(ends_obj, &ends, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&starts);
        PyBuffer_Release(&buf);
        Py_DECREF(sizes);
        return NULL;
    }
    PyObject *result = NULL;
    if (starts.len < n * 8 || ends.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must hold len(sizes) int64 items");
        goto done;
    }
    Py_ssize_t *size_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n > 0 ? n : 1));
    if (size_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(sizes);
    for (Py_ssize_t i = 0; i < n; i++) {
        size_of[i] = PyLong_AsSsize_t(items[i]);
        if (size_of[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(size_of);
            goto done;
        }
    }
    Py_ssize_t count;
    long long payload;
    Py_BEGIN_ALLOW_THREADS  /* the walk touches only the held buffers */
    count = walk_envelopes(buf.buf, buf.len, size_of, n, ledger_id, entry_id, starts.buf,
                           ends.buf, &payload);
    Py_END_ALLOW_THREADS
    PyMem_Free(size_of);
    result = Py_BuildValue("nL", count, payload);
done:
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&buf);
    Py_DECREF(sizes);
    return result;
}

PyDoc_STRVAR(add_lacs_doc,
"add_lacs(entries, ledger_id) -> list[int | None]\n\n"
"The piggybacked LAC of each (entry_id, envelope) of a batch of adds to ledger_id,\n"
"None where the envelope is not a valid CRC32C envelope of that entry.");

static PyObject *
add_lacs(PyObject *self, PyObject *args)
{
    PyObject *entries_obj, *ledger_obj;
    if (!PyArg_ParseTuple(args, "OO:add_lacs", &entries_obj, &ledger_obj))
        return NULL;
    uint64_t ledger_id;
    if (get_u64(ledger_obj, &ledger_id, "ledger_id") < 0)
        return NULL;
    PyObject *entries = PySequence_Fast(entries_obj, "entries must be a sequence");
    if (entries == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(entries);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    PyObject **items = PySequence_Fast_ITEMS(entries);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        PyObject *id_obj, *data_obj;
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) {
            id_obj = PyTuple_GET_ITEM(item, 0);
            data_obj = PyTuple_GET_ITEM(item, 1);
        } else if (PyList_Check(item) && PyList_GET_SIZE(item) == 2) {
            id_obj = PyList_GET_ITEM(item, 0);
            data_obj = PyList_GET_ITEM(item, 1);
        } else {
            PyErr_SetString(PyExc_TypeError, "entries must hold (entry_id, envelope) pairs");
            goto fail;
        }
        uint64_t entry_id;
        int64_t lac = INT64_MIN;
        unsigned long long id = PyLong_AsUnsignedLongLong(id_obj);
        if (id == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();  /* a negative or huge id names no envelope: None */
        } else {
            entry_id = id;
            Py_buffer data;
            if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0)
                goto fail;
            lac = envelope_lac(data.buf, data.len, ledger_id, entry_id);
            PyBuffer_Release(&data);
        }
        PyObject *value;
        if (lac == INT64_MIN) {
            value = Py_None;
            Py_INCREF(value);
        } else if ((value = PyLong_FromLongLong(lac)) == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(entries);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(entries);
    return NULL;
}

/* ------------------------------------------------------ entry log frames */

/* frame: length u32 | ledger u64 | entry u64 | crc32c u32 | data; the CRC
 * covers the first 20 bytes and the data. */
#define FRAME_HEAD 20
#define FRAME_OVERHEAD 24

PyDoc_STRVAR(frames_following_doc,
"frames_following(buf, pos, ledger_id, entry_id, count_max, room, entry_max) -> list[bytes]\n\n"
"The data of the frames back to back in buf from pos that hold entries entry_id,\n"
"entry_id + 1, ... of ledger_id, each with a good CRC32C and at most entry_max bytes:\n"
"at most count_max of them, and no more than room data bytes in all. Stops at the\n"
"first frame that does not qualify.");

static PyObject *
frames_following(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos, count_max, room, entry_max;
    PyObject *ledger_obj, *entry_obj;
    if (!PyArg_ParseTuple(args, "y*nOOnnn:frames_following", &buf, &pos, &ledger_obj,
                          &entry_obj, &count_max, &room, &entry_max))
        return NULL;
    uint64_t ledger_id, expected;
    PyObject *out = NULL;
    if (get_u64(ledger_obj, &ledger_id, "ledger_id") < 0
            || get_u64(entry_obj, &expected, "entry_id") < 0)
        goto done;
    if ((out = PyList_New(0)) == NULL)
        goto done;
    const unsigned char *base = buf.buf;
    Py_ssize_t total = buf.len;
    if (pos < 0 || pos > total) {
        PyErr_SetString(PyExc_ValueError, "pos lies outside buf");
        Py_CLEAR(out);
        goto done;
    }
    while (PyList_GET_SIZE(out) < count_max && total - pos >= FRAME_OVERHEAD) {
        const unsigned char *p = base + pos;
        Py_ssize_t length = (Py_ssize_t)be32(p);
        room -= length;
        if (be64(p + 4) != ledger_id || be64(p + 12) != expected || length > entry_max
                || length > total - pos - FRAME_OVERHEAD || room < 0)
            break;
        uint32_t crc = crc32c_extend(crc32c_extend(0, p, FRAME_HEAD), p + FRAME_OVERHEAD,
                                     (size_t)length);
        if (crc != be32(p + FRAME_HEAD))
            break;
        PyObject *data = PyBytes_FromStringAndSize((const char *)p + FRAME_OVERHEAD, length);
        if (data == NULL || PyList_Append(out, data) < 0) {
            Py_XDECREF(data);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(data);
        pos += FRAME_OVERHEAD + length;
        expected++;
    }
done:
    PyBuffer_Release(&buf);
    return out;
}

/* ------------------------------------------------------- stream entries */

/* entry := magic "QS" | version u8 | flags u8 | count u32 | message * count
 * message := publish_time_ms i64 | key_length i32 (-1: none) | props_length u32
 *            | value_length u32 | key | props | value          (little-endian) */
#define SENTRY_HEADER 8
#define SMESSAGE_HEADER 20

static inline void
put_i32(unsigned char *out, Py_ssize_t index, int32_t value)
{
    memcpy(out + 4 * index, &value, 4);
}

PyDoc_STRVAR(stream_columns_doc,
"stream_columns(buffer, starts, ends, prefix_word, count_max) -> tuple | None\n\n"
"Decode the stream entries buffer[starts[i]:ends[i]] (int64 buffers) into Arrow\n"
"column buffers, in (entry, batch index) order: (rows, entry_pos int32, batch_index\n"
"int32, publish_ms int64, key validity bitmap, key offsets int32, key data, value\n"
"offsets int32, value data, props_start int32, props_length int32, props_any).\n"
"None when any entry breaks the format (a wrong prefix word, a count outside\n"
"[1, count_max], a length running past its entry, bytes after the last message).");

/* Pass 1 of stream_columns: check every entry; count rows, key and value bytes.
 * 0, or -1 when an entry breaks the format. Touches no Python object. */
static int
scan_entries(const unsigned char *base, Py_ssize_t total, const int64_t *starts,
             const int64_t *ends, Py_ssize_t n, uint32_t prefix_word, Py_ssize_t count_max,
             Py_ssize_t *rows_out, Py_ssize_t *key_out, Py_ssize_t *value_out)
{
    Py_ssize_t rows = 0, key_bytes = 0, value_bytes = 0;
    for (Py_ssize_t e = 0; e < n; e++) {
        int64_t start = starts[e], end = ends[e];
        if (start < 0 || end > total || end - start < SENTRY_HEADER)
            return -1;
        const unsigned char *p = base + start;
        uint32_t count = le32(p + 4);
        if (le32(p) != prefix_word || count < 1 || (Py_ssize_t)count > count_max)
            return -1;
        int64_t offset = start + SENTRY_HEADER;
        for (uint32_t k = 0; k < count; k++) {
            if (end - offset < SMESSAGE_HEADER)
                return -1;
            const unsigned char *m = base + offset;
            int32_t key_length = (int32_t)le32(m + 8);
            if (key_length < -1)
                return -1;
            int64_t body = (int64_t)(key_length > 0 ? key_length : 0) + le32(m + 12)
                + le32(m + 16);
            if (body > end - offset - SMESSAGE_HEADER)
                return -1;
            key_bytes += key_length > 0 ? key_length : 0;
            value_bytes += le32(m + 16);
            offset += SMESSAGE_HEADER + body;
        }
        if (offset != end)
            return -1;
        rows += count;
    }
    *rows_out = rows;
    *key_out = key_bytes;
    *value_out = value_bytes;
    return 0;
}

/* Pass 2 of stream_columns: write the column buffers (out[0..9], sized by the
 * caller from pass 1's counts); returns whether any message has properties. */
static int
fill_columns(const unsigned char *base, const int64_t *starts, Py_ssize_t n,
             unsigned char *const out[10], size_t key_valid_bytes)
{
    unsigned char *entry_pos = out[0], *batch_index = out[1], *publish = out[2];
    unsigned char *key_valid = out[3], *key_offsets = out[4], *key_data = out[5];
    unsigned char *value_offsets = out[6], *value_data = out[7];
    unsigned char *props_start = out[8], *props_length = out[9];
    memset(key_valid, 0, key_valid_bytes);
    int props_any = 0;
    int32_t key_at = 0, value_at = 0;
    Py_ssize_t row = 0;
    put_i32(key_offsets, 0, 0);
    put_i32(value_offsets, 0, 0);
    for (Py_ssize_t e = 0; e < n; e++) {
        const unsigned char *p = base + starts[e];
        uint32_t count = le32(p + 4);
        int64_t offset = starts[e] + SENTRY_HEADER;
        for (uint32_t k = 0; k < count; k++, row++) {
            const unsigned char *m = base + offset;
            int32_t key_length = (int32_t)le32(m + 8);
            uint32_t props = le32(m + 12), value_length = le32(m + 16);
            int64_t at = offset + SMESSAGE_HEADER;
            put_i32(entry_pos, row, (int32_t)e);
            put_i32(batch_index, row, (int32_t)k);
            int64_t publish_ms = (int64_t)le64(m);
            memcpy(publish + 8 * row, &publish_ms, 8);
            if (key_length >= 0) {
                key_valid[row >> 3] |= (unsigned char)(1u << (row & 7));
                memcpy(key_data + key_at, base + at, (size_t)key_length);
                key_at += key_length;
                at += key_length;
            }
            put_i32(key_offsets, row + 1, key_at);
            put_i32(props_start, row, (int32_t)at);
            put_i32(props_length, row, (int32_t)props);
            props_any |= props != 0;
            at += props;
            memcpy(value_data + value_at, base + at, value_length);
            value_at += (int32_t)value_length;
            put_i32(value_offsets, row + 1, value_at);
            offset = at + value_length;
        }
    }
    return props_any;
}

static PyObject *
stream_columns(PyObject *self, PyObject *args)
{
    Py_buffer buf, starts_buf, ends_buf;
    unsigned int prefix_word;
    Py_ssize_t count_max;
    if (!PyArg_ParseTuple(args, "y*y*y*In:stream_columns", &buf, &starts_buf, &ends_buf,
                          &prefix_word, &count_max))
        return NULL;
    PyObject *result = NULL;
    PyObject *cols[11] = {NULL};
    Py_ssize_t n = starts_buf.len / 8;
    if (ends_buf.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        goto done;
    }
    const unsigned char *base = buf.buf;
    const int64_t *starts = starts_buf.buf, *ends = ends_buf.buf;
    Py_ssize_t rows = 0, key_bytes = 0, value_bytes = 0;
    int scanned;
    /* The passes touch only the held buffers: other threads (the I/O loop
     * receiving the next chunk) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    scanned = scan_entries(base, buf.len, starts, ends, n, prefix_word, count_max, &rows,
                           &key_bytes, &value_bytes);
    Py_END_ALLOW_THREADS
    if (scanned < 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (rows > INT32_MAX || key_bytes > INT32_MAX || value_bytes > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a chunk too large for int32 Arrow offsets");
        goto done;
    }
    Py_ssize_t sizes[10] = {4 * rows, 4 * rows, 8 * rows, (rows + 7) / 8, 4 * (rows + 1),
                            key_bytes, 4 * (rows + 1), value_bytes, 4 * rows, 4 * rows};
    unsigned char *out[10];
    for (int c = 0; c < 10; c++) {
        if ((cols[c] = PyBytes_FromStringAndSize(NULL, sizes[c])) == NULL)
            goto done;
        out[c] = (unsigned char *)PyBytes_AS_STRING(cols[c]);
    }
    int props_any;
    Py_BEGIN_ALLOW_THREADS
    props_any = fill_columns(base, starts, n, out, (size_t)sizes[3]);
    Py_END_ALLOW_THREADS
    cols[10] = PyBool_FromLong(props_any);
    result = Py_BuildValue("nNNNNNNNNNNN", rows, cols[0], cols[1], cols[2], cols[3], cols[4],
                           cols[5], cols[6], cols[7], cols[8], cols[9], cols[10]);
    for (int c = 0; c < 11; c++)
        cols[c] = NULL;  /* stolen by "N" (or freed with the tuple on failure) */
done:
    for (int c = 0; c < 11; c++)
        Py_XDECREF(cols[c]);
    PyBuffer_Release(&ends_buf);
    PyBuffer_Release(&starts_buf);
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0) -> int\n\n"
"CRC32C of data continuing from value (the crc32c package's function); for tests.");

static PyObject *
crc32c_py(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &buf, &value))
        return NULL;
    uint32_t crc = crc32c_extend(value, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *
hardware(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(have_sse42);
}

static PyMethodDef methods[] = {
    {"envelope_bounds", envelope_bounds, METH_VARARGS, envelope_bounds_doc},
    {"add_lacs", add_lacs, METH_VARARGS, add_lacs_doc},
    {"frames_following", frames_following, METH_VARARGS, frames_following_doc},
    {"stream_columns", stream_columns, METH_VARARGS, stream_columns_doc},
    {"crc32c", crc32c_py, METH_VARARGS, crc32c_doc},
    {"hardware", hardware, METH_NOARGS, "Whether CRC32C uses the CPU's instruction."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "quorumlog_native._walk",
    "quorumlog's C loops over many entries a call.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    crc_init_tables();
#ifdef QL_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (getenv("QUORUMLOG_NATIVE_SOFT_CRC") != NULL)
        have_sse42 = 0;
#endif
    return PyModule_Create(&module);
}
