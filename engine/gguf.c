/* gguf.c - validating, memory-mapped reader for GGUF v2/v3 files.
 *
 * Everything in the file is treated as hostile: every count, length, type,
 * shape and offset is checked against the bytes that remain before it is
 * used, with overflow-safe arithmetic. Allocations grow with the entries
 * actually parsed, so a huge declared count cannot cause a huge allocation.
 *
 * Byte order: GGUF files are little-endian and this reader assumes a
 * little-endian host (x86-64). Numeric fields may be unaligned in the file,
 * so every read goes through memcpy.
 */
#include "rlai/gguf.h"
#include "hash.h"
#include "rlai/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host"
#endif

#define GGUF_HEADER_BYTES 24u        /* magic, version, tensor_count, kv_count */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_NAME_LEN 64u
#define GGUF_MAX_ARRAY_DEPTH 8u
/* Smallest encodings, used to bound declared counts by the remaining bytes. */
#define GGUF_MIN_KV_BYTES 13u        /* key len (8) + type (4) + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 32u    /* name len 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define GGUF_MIN_ARRAY_BYTES 12u     /* elem type 4 + count 8 */

struct gguf_kv {
    rlai_gguf_str key;
    uint32_t vtype;
    /* Scalars: the value bytes. Strings: str. Arrays: elem_type, n and
     * data (first element; for string/array elements the raw encoding). */
    const uint8_t *val;
    rlai_gguf_str str;
    uint32_t elem_type;
    uint64_t n;
};

struct rlai_gguf {
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    struct gguf_kv *kvs;
    size_t *kv_index;     /* open addressing: entry = kv index + 1, 0 = empty */
    size_t kv_index_cap;  /* power of two */
    uint64_t n_tensors;
    rlai_gguf_tensor *tensors;
    size_t *t_index;
    size_t t_index_cap;
    uint64_t data_offset; /* start of the tensor data blob in the file */
};

/* ---------------------------------------------------------------- errors */

static int set_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int set_err(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(err, errlen, "gguf: ");
        if (n >= 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---------------------------------------------------------------- reader */

typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
    char *err;
    size_t errlen;
} reader;

static size_t rd_left(const reader *r) { return r->len - r->pos; }

static bool rd_u32(reader *r, uint32_t *v)
{
    if (rd_left(r) < 4) return false;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool rd_u64(reader *r, uint64_t *v)
{
    if (rd_left(r) < 8) return false;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return true;
}

/* Reads a gguf_string. Returns 0 on success, 1 if the length field is
 * truncated, 2 if the body exceeds the remaining bytes (*len_out set). */
static int rd_str(reader *r, rlai_gguf_str *s, uint64_t *len_out)
{
    uint64_t n;
    if (!rd_u64(r, &n)) return 1;
    *len_out = n;
    if (n > rd_left(r)) { r->pos -= 8; return 2; }
    s->ptr = (const char *)(r->p + r->pos);
    s->len = (size_t)n;
    r->pos += (size_t)n;
    return 0;
}

/* Formats "what" once, only on the error path. */
static int trunc_err(reader *r, size_t need, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int trunc_err(reader *r, size_t need, const char *fmt, ...)
{
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                   "truncated file: %s needs %zu bytes at offset %zu but only %zu remain",
                   what, need, r->pos, rd_left(r));
}

static int str_err(reader *r, int st, uint64_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int str_err(reader *r, int st, uint64_t n, const char *fmt, ...)
{
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (st == 1)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "truncated file: %s string length needs 8 bytes at offset %zu but only %zu remain",
                       what, r->pos, rd_left(r));
    return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                   "truncated file: %s string length %" PRIu64 " exceeds remaining %zu bytes (offset %zu)",
                   what, n, rd_left(r) >= 8 ? rd_left(r) - 8 : 0, r->pos + 8);
}

/* ---------------------------------------------------------------- types */

static size_t vtype_size(uint32_t t)
{
    switch (t) {
    case RLAI_GGUF_U8: case RLAI_GGUF_I8: case RLAI_GGUF_BOOL: return 1;
    case RLAI_GGUF_U16: case RLAI_GGUF_I16: return 2;
    case RLAI_GGUF_U32: case RLAI_GGUF_I32: case RLAI_GGUF_F32: return 4;
    case RLAI_GGUF_U64: case RLAI_GGUF_I64: case RLAI_GGUF_F64: return 8;
    default: return 0; /* string, array: variable */
    }
}

static bool vtype_known(uint32_t t) { return t <= RLAI_GGUF_F64; }

static const char *vtype_name(uint32_t t)
{
    static const char *const names[] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
        "string", "array", "u64", "i64", "f64",
    };
    return t <= RLAI_GGUF_F64 ? names[t] : "unknown";
}

/* Minimum encoded size of one element of type t (t known). */
static size_t vtype_min_size(uint32_t t)
{
    if (t == RLAI_GGUF_STRING) return 8;
    if (t == RLAI_GGUF_ARRAY) return GGUF_MIN_ARRAY_BYTES;
    return vtype_size(t);
}

/* ggml tensor types whose storage size is known: elements and bytes per
 * block. Returns false for ids this reader cannot size. */
static bool ggml_type_size(uint32_t t, uint32_t *blck, uint32_t *bytes)
{
    static const struct { uint16_t blck, bytes; } tab[] = {
        [0] = {1, 4},      /* F32 */
        [1] = {1, 2},      /* F16 */
        [2] = {32, 18},    /* Q4_0 */
        [3] = {32, 20},    /* Q4_1 */
        [6] = {32, 22},    /* Q5_0 */
        [7] = {32, 24},    /* Q5_1 */
        [8] = {32, 34},    /* Q8_0 */
        [9] = {32, 36},    /* Q8_1 */
        [10] = {256, 84},  /* Q2_K */
        [11] = {256, 110}, /* Q3_K */
        [12] = {256, 144}, /* Q4_K */
        [13] = {256, 176}, /* Q5_K */
        [14] = {256, 210}, /* Q6_K */
        [15] = {256, 292}, /* Q8_K */
        [16] = {256, 66},  /* IQ2_XXS */
        [17] = {256, 74},  /* IQ2_XS */
        [18] = {256, 98},  /* IQ3_XXS */
        [19] = {256, 50},  /* IQ1_S */
        [20] = {32, 18},   /* IQ4_NL */
        [21] = {256, 110}, /* IQ3_S */
        [22] = {256, 82},  /* IQ2_S */
        [23] = {256, 136}, /* IQ4_XS */
        [24] = {1, 1},     /* I8 */
        [25] = {1, 2},     /* I16 */
        [26] = {1, 4},     /* I32 */
        [27] = {1, 8},     /* I64 */
        [28] = {1, 8},     /* F64 */
        [29] = {256, 56},  /* IQ1_M */
        [30] = {1, 2},     /* BF16 */
        [34] = {256, 54},  /* TQ1_0 */
        [35] = {256, 66},  /* TQ2_0 */
        [39] = {32, 17},   /* MXFP4 */
    };
    if (t >= sizeof tab / sizeof tab[0] || tab[t].blck == 0) return false;
    *blck = tab[t].blck;
    *bytes = tab[t].bytes;
    return true;
}

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const char *p, size_t n)
{
    return rlai_hash_bytes(p, n);
}

static bool str_eq(rlai_gguf_str a, const char *p, size_t n)
{
    return a.len == n && (n == 0 || memcmp(a.ptr, p, n) == 0);
}

/* Builds an index over n names (get(i) returns name i). Returns 0, or
 * RLAI_ERR_NOMEM, or the 1-based index of the first duplicate's second
 * occurrence as a positive number in *dup. */
typedef rlai_gguf_str (*name_fn)(const struct rlai_gguf *g, size_t i);

static rlai_gguf_str kv_name(const struct rlai_gguf *g, size_t i) { return g->kvs[i].key; }
static rlai_gguf_str t_name(const struct rlai_gguf *g, size_t i) { return g->tensors[i].name; }

static int build_index(const struct rlai_gguf *g, size_t n, name_fn get,
                       size_t **out, size_t *cap_out, size_t *dup_a, size_t *dup_b)
{
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1; /* n is bounded by file size, no overflow */
    size_t *tab = calloc(cap, sizeof *tab);
    if (!tab) return RLAI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        rlai_gguf_str s = get(g, i);
        size_t h = (size_t)hash_bytes(s.ptr, s.len) & (cap - 1);
        for (;;) {
            size_t e = tab[h];
            if (e == 0) { tab[h] = i + 1; break; }
            if (str_eq(get(g, e - 1), s.ptr, s.len)) {
                free(tab);
                *dup_a = e - 1;
                *dup_b = i;
                return 1;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    *out = tab;
    *cap_out = cap;
    return 0;
}

static size_t index_lookup(const struct rlai_gguf *g, const size_t *tab, size_t cap,
                           name_fn get, const char *name)
{
    if (!tab || !name) return SIZE_MAX;
    size_t n = strlen(name);
    size_t h = (size_t)hash_bytes(name, n) & (cap - 1);
    for (;;) {
        size_t e = tab[h];
        if (e == 0) return SIZE_MAX;
        if (str_eq(get(g, e - 1), name, n)) return e - 1;
        h = (h + 1) & (cap - 1);
    }
}

/* ---------------------------------------------------------------- parsing */

/* Grows *arr (element size esz) so that index `need` fits. Capacity starts
 * small and doubles, capped by `max` (the count bounded by remaining bytes). */
static int grow(void **arr, size_t *cap, size_t need, size_t esz, uint64_t max)
{
    if (need < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    if (nc > max) nc = (size_t)max;
    if (nc <= need) nc = need + 1;
    if (nc > SIZE_MAX / esz) return RLAI_ERR_NOMEM;
    void *p = realloc(*arr, nc * esz);
    if (!p) return RLAI_ERR_NOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

/* Skips and validates the elements of an array (already read its header).
 * depth: nesting level of this array (top-level value = 1). */
static int skip_array(reader *r, uint32_t et, uint64_t n, unsigned depth,
                      uint64_t kidx, rlai_gguf_str key)
{
    if (!vtype_known(et))
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "metadata key #%" PRIu64 " '%.*s': array element type %" PRIu32 " unknown",
                       kidx, (int)key.len, key.ptr, et);
    if (et == RLAI_GGUF_ARRAY && depth >= GGUF_MAX_ARRAY_DEPTH)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "metadata key #%" PRIu64 " '%.*s': arrays nested deeper than %u levels",
                       kidx, (int)key.len, key.ptr, GGUF_MAX_ARRAY_DEPTH);
    size_t msz = vtype_min_size(et);
    if (n > rd_left(r) / msz)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "truncated file: metadata key #%" PRIu64 " '%.*s': array of %" PRIu64
                       " %s elements (>= %zu bytes each) exceeds remaining %zu bytes",
                       kidx, (int)key.len, key.ptr, n, vtype_name(et), msz, rd_left(r));
    if (et == RLAI_GGUF_BOOL) {
        for (uint64_t i = 0; i < n; i++) {
            uint8_t b = r->p[r->pos + i];
            if (b > 1)
                return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                               "metadata key #%" PRIu64 " '%.*s': array element %" PRIu64
                               " bool value %u is not 0 or 1",
                               kidx, (int)key.len, key.ptr, i, b);
        }
    }
    if (et != RLAI_GGUF_STRING && et != RLAI_GGUF_ARRAY) {
        r->pos += (size_t)n * msz; /* bounded above */
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (et == RLAI_GGUF_STRING) {
            rlai_gguf_str s;
            uint64_t sl = 0;
            int st = rd_str(r, &s, &sl);
            if (st)
                return str_err(r, st, sl, "metadata key #%" PRIu64 " '%.*s' array element %" PRIu64,
                               kidx, (int)key.len, key.ptr, i);
        } else {
            uint32_t et2;
            uint64_t n2;
            if (!rd_u32(r, &et2) || !rd_u64(r, &n2))
                return trunc_err(r, GGUF_MIN_ARRAY_BYTES,
                                 "metadata key #%" PRIu64 " '%.*s' nested array header %" PRIu64,
                                 kidx, (int)key.len, key.ptr, i);
            int rc = skip_array(r, et2, n2, depth + 1, kidx, key);
            if (rc) return rc;
        }
    }
    return 0;
}

static int parse_kv(rlai_gguf *g, reader *r, uint64_t i, struct gguf_kv *kv)
{
    uint64_t sl = 0;
    int st = rd_str(r, &kv->key, &sl);
    if (st) return str_err(r, st, sl, "metadata key #%" PRIu64, i);
    if (kv->key.len > GGUF_MAX_KEY_LEN)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "metadata key #%" PRIu64 ": key length %zu exceeds %u",
                       i, kv->key.len, GGUF_MAX_KEY_LEN);
    rlai_gguf_str key = kv->key;
    if (!rd_u32(r, &kv->vtype))
        return trunc_err(r, 4, "metadata key #%" PRIu64 " '%.*s' value type",
                         i, (int)key.len, key.ptr);
    uint32_t t = kv->vtype;
    if (!vtype_known(t))
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "metadata key #%" PRIu64 " '%.*s': value type %" PRIu32 " unknown",
                       i, (int)key.len, key.ptr, t);
    kv->val = r->p + r->pos;
    if (t == RLAI_GGUF_STRING) {
        st = rd_str(r, &kv->str, &sl);
        if (st) return str_err(r, st, sl, "metadata key #%" PRIu64 " '%.*s' value",
                               i, (int)key.len, key.ptr);
        return 0;
    }
    if (t == RLAI_GGUF_ARRAY) {
        if (!rd_u32(r, &kv->elem_type) || !rd_u64(r, &kv->n))
            return trunc_err(r, GGUF_MIN_ARRAY_BYTES, "metadata key #%" PRIu64 " '%.*s' array header",
                             i, (int)key.len, key.ptr);
        kv->val = r->p + r->pos;
        return skip_array(r, kv->elem_type, kv->n, 1, i, key);
    }
    size_t sz = vtype_size(t);
    if (rd_left(r) < sz)
        return trunc_err(r, sz, "metadata key #%" PRIu64 " '%.*s' %s value",
                         i, (int)key.len, key.ptr, vtype_name(t));
    if (t == RLAI_GGUF_BOOL && r->p[r->pos] > 1)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "metadata key #%" PRIu64 " '%.*s': bool value %u is not 0 or 1",
                       i, (int)key.len, key.ptr, r->p[r->pos]);
    r->pos += sz;
    (void)g;
    return 0;
}

static int parse_tensor_info(reader *r, uint64_t i, rlai_gguf_tensor *t)
{
    memset(t, 0, sizeof *t);
    uint64_t sl = 0;
    int st = rd_str(r, &t->name, &sl);
    if (st) return str_err(r, st, sl, "tensor info #%" PRIu64 " name", i);
    rlai_gguf_str nm = t->name;
    if (nm.len == 0)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT, "tensor info #%" PRIu64 ": empty name", i);
    if (nm.len > GGUF_MAX_NAME_LEN)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "tensor info #%" PRIu64 ": name length %zu exceeds %u",
                       i, nm.len, GGUF_MAX_NAME_LEN);
    if (!rd_u32(r, &t->n_dims))
        return trunc_err(r, 4, "tensor '%.*s' n_dims", (int)nm.len, nm.ptr);
    if (t->n_dims < 1 || t->n_dims > RLAI_GGUF_MAX_DIMS)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "tensor '%.*s': n_dims %" PRIu32 " not in 1..%d",
                       (int)nm.len, nm.ptr, t->n_dims, RLAI_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < RLAI_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!rd_u64(r, &t->ne[d]))
            return trunc_err(r, 8, "tensor '%.*s' ne[%" PRIu32 "]", (int)nm.len, nm.ptr, d);
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                           "tensor '%.*s': ne[%" PRIu32 "] = %" PRIu64 " out of range",
                           (int)nm.len, nm.ptr, d, t->ne[d]);
    }
    if (!rd_u32(r, &t->type))
        return trunc_err(r, 4, "tensor '%.*s' type", (int)nm.len, nm.ptr);
    if (!rd_u64(r, &t->offset))
        return trunc_err(r, 8, "tensor '%.*s' offset", (int)nm.len, nm.ptr);

    /* Element count must fit int64 (ggml uses int64_t ne). */
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] > (uint64_t)INT64_MAX / nel)
            return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                           "tensor '%.*s': element count overflows int64",
                           (int)nm.len, nm.ptr);
        nel *= t->ne[d];
    }
    uint32_t blck, bsz;
    if (!ggml_type_size(t->type, &blck, &bsz))
        return set_err(r->err, r->errlen, RLAI_ERR_UNSUPPORTED,
                       "tensor '%.*s': type %" PRIu32 " unknown",
                       (int)nm.len, nm.ptr, t->type);
    if (t->ne[0] % blck != 0)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "tensor '%.*s': ne[0] = %" PRIu64 " is not a multiple of the block size %" PRIu32
                       " of type %" PRIu32,
                       (int)nm.len, nm.ptr, t->ne[0], blck, t->type);
    /* nbytes = (nel / blck) * bsz, overflow-checked */
    uint64_t nblocks = nel / blck;
    if (nblocks > UINT64_MAX / bsz || nblocks * bsz > (uint64_t)SIZE_MAX)
        return set_err(r->err, r->errlen, RLAI_ERR_FORMAT,
                       "tensor '%.*s': data size overflows", (int)nm.len, nm.ptr);
    t->nbytes = nblocks * bsz;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const rlai_gguf_tensor *x = *(const rlai_gguf_tensor *const *)a;
    const rlai_gguf_tensor *y = *(const rlai_gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

static int parse(rlai_gguf *g, char *err, size_t errlen)
{
    reader rr = { g->base, g->size, 0, err, errlen };
    reader *r = &rr;
    int rc;

    if (g->size < 4 && memcmp(g->base, "GGUF", g->size) == 0)
        return trunc_err(r, 4, "header magic");
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0)
        return set_err(err, errlen, RLAI_ERR_FORMAT, "bad magic (not a GGUF file)");
    r->pos = 4;
    if (!rd_u32(r, &g->version))
        return trunc_err(r, 4, "header version");
    if (g->version == 1)
        return set_err(err, errlen, RLAI_ERR_UNSUPPORTED,
                       "GGUF version 1 is not supported (only versions 2 and 3)");
    if (g->version != 2 && g->version != 3)
        return set_err(err, errlen, RLAI_ERR_UNSUPPORTED,
                       "GGUF version %" PRIu32 " is not supported (only versions 2 and 3%s)",
                       g->version,
                       (g->version & 0xFFFF) == 0 ? "; big-endian files are not supported" : "");
    uint64_t n_tensors, n_kv;
    if (!rd_u64(r, &n_tensors))
        return trunc_err(r, 8, "header tensor_count");
    if (!rd_u64(r, &n_kv))
        return trunc_err(r, 8, "header kv_count");
    if (n_kv > rd_left(r) / GGUF_MIN_KV_BYTES)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "truncated file: kv_count %" PRIu64 " cannot fit in the remaining %zu bytes",
                       n_kv, rd_left(r));
    if (n_tensors > rd_left(r) / GGUF_MIN_TENSOR_BYTES)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "truncated file: tensor_count %" PRIu64 " cannot fit in the remaining %zu bytes",
                       n_tensors, rd_left(r));

    /* Metadata. */
    size_t kv_cap = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        rc = grow((void **)&g->kvs, &kv_cap, (size_t)i, sizeof *g->kvs, n_kv);
        if (rc) return set_err(err, errlen, rc, "out of memory reading metadata");
        struct gguf_kv *kv = &g->kvs[i];
        memset(kv, 0, sizeof *kv);
        rc = parse_kv(g, r, i, kv);
        if (rc) return rc;
        g->n_kv = i + 1;
    }
    size_t da, db;
    rc = build_index(g, (size_t)g->n_kv, kv_name, &g->kv_index, &g->kv_index_cap, &da, &db);
    if (rc < 0) return set_err(err, errlen, rc, "out of memory indexing metadata");
    if (rc > 0)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "duplicate metadata key '%.*s' (#%zu and #%zu)",
                       (int)g->kvs[db].key.len, g->kvs[db].key.ptr, da, db);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    size_t ai = index_lookup(g, g->kv_index, g->kv_index_cap, kv_name, "general.alignment");
    if (ai != SIZE_MAX) {
        const struct gguf_kv *kv = &g->kvs[ai];
        if (kv->vtype != RLAI_GGUF_U32)
            return set_err(err, errlen, RLAI_ERR_FORMAT,
                           "general.alignment has type %s, expected u32", vtype_name(kv->vtype));
        uint32_t a;
        memcpy(&a, kv->val, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return set_err(err, errlen, RLAI_ERR_FORMAT,
                           "general.alignment %" PRIu32 " is not a nonzero power of two", a);
        g->alignment = a;
    }

    /* Tensor infos. */
    if (n_tensors > rd_left(r) / GGUF_MIN_TENSOR_BYTES)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "truncated file: tensor_count %" PRIu64 " cannot fit in the remaining %zu bytes",
                       n_tensors, rd_left(r));
    size_t t_cap = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        rc = grow((void **)&g->tensors, &t_cap, (size_t)i, sizeof *g->tensors, n_tensors);
        if (rc) return set_err(err, errlen, rc, "out of memory reading tensor infos");
        rc = parse_tensor_info(r, i, &g->tensors[i]);
        if (rc) return rc;
        g->n_tensors = i + 1;
        if (g->tensors[i].offset % g->alignment != 0)
            return set_err(err, errlen, RLAI_ERR_FORMAT,
                           "tensor '%.*s': offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                           (int)g->tensors[i].name.len, g->tensors[i].name.ptr,
                           g->tensors[i].offset, g->alignment);
    }
    rc = build_index(g, (size_t)g->n_tensors, t_name, &g->t_index, &g->t_index_cap, &da, &db);
    if (rc < 0) return set_err(err, errlen, rc, "out of memory indexing tensors");
    if (rc > 0)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "duplicate tensor name '%.*s' (#%zu and #%zu)",
                       (int)g->tensors[db].name.len, g->tensors[db].name.ptr, da, db);

    /* Data blob: starts at the header end rounded up to the alignment. */
    uint64_t hdr_end = r->pos;
    uint64_t pad = (g->alignment - hdr_end % g->alignment) % g->alignment;
    g->data_offset = hdr_end + pad; /* hdr_end <= SIZE_MAX, pad < 2^32: no overflow */
    if (g->n_tensors == 0) return 0;
    if (g->data_offset > g->size)
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "truncated file: tensor data would start at offset %" PRIu64
                       " beyond end of file (size %zu)", g->data_offset, g->size);
    uint64_t blob = g->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        rlai_gguf_tensor *t = &g->tensors[i];
        if (t->offset > blob || t->nbytes > blob - t->offset)
            return set_err(err, errlen, RLAI_ERR_FORMAT,
                           "tensor '%.*s': data [%" PRIu64 ", +%" PRIu64 ") of the blob at %" PRIu64
                           " extends beyond end of file (size %zu)",
                           (int)t->name.len, t->name.ptr, t->offset, t->nbytes,
                           g->data_offset, g->size);
        t->data = g->base + g->data_offset + t->offset;
    }

    /* Overlap check: sort pointers by offset. */
    const rlai_gguf_tensor **order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return set_err(err, errlen, RLAI_ERR_NOMEM, "out of memory checking tensor overlap");
    for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_by_offset);
    rc = 0;
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const rlai_gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset) { /* both within the file: no overflow */
            rc = set_err(err, errlen, RLAI_ERR_FORMAT,
                         "tensors '%.*s' [%" PRIu64 ", +%" PRIu64 ") and '%.*s' [%" PRIu64 ", +%" PRIu64
                         ") overlap",
                         (int)a->name.len, a->name.ptr, a->offset, a->nbytes,
                         (int)b->name.len, b->name.ptr, b->offset, b->nbytes);
            break;
        }
    }
    free(order);
    return rc;
}

/* ---------------------------------------------------------------- open/close */

static int open_common(rlai_gguf *g, rlai_gguf **out, char *err, size_t errlen)
{
    int rc = parse(g, err, errlen);
    if (rc) {
        rlai_gguf_close(g);
        return rc;
    }
    if (err && errlen > 0) err[0] = '\0';
    *out = g;
    return 0;
}

/* Maps `path` read-only (MAP_PRIVATE) and validates it. On success *out is
 * owned by the caller and freed with rlai_gguf_close(); on error *out is NULL
 * and nothing is left mapped or allocated. */
int rlai_gguf_open_file(const char *path, rlai_gguf **out, char *err, size_t errlen)
{
    if (!out) return set_err(err, errlen, RLAI_ERR_INVALID_ARG, "NULL output pointer");
    *out = NULL;
    if (!path) return set_err(err, errlen, RLAI_ERR_INVALID_ARG, "NULL path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return set_err(err, errlen, RLAI_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return set_err(err, errlen, RLAI_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return set_err(err, errlen, RLAI_ERR_IO, "'%s' is not a regular file", path);
    }
    if (st.st_size < (off_t)GGUF_HEADER_BYTES) {
        close(fd);
        return set_err(err, errlen, RLAI_ERR_FORMAT,
                       "truncated file: '%s' is %lld bytes, a GGUF header needs %u",
                       path, (long long)st.st_size, GGUF_HEADER_BYTES);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return set_err(err, errlen, RLAI_ERR_IO, "'%s' is too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return set_err(err, errlen, RLAI_ERR_IO, "cannot mmap '%s': %s", path, strerror(e));
    rlai_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(map, size);
        return set_err(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    }
    g->base = map;
    g->size = size;
    g->mapped = true;
    return open_common(g, out, err, errlen);
}

/* Validates a caller-owned buffer; it is not copied and must outlive *out
 * (freed with rlai_gguf_close, which does not free the buffer). */
int rlai_gguf_open_memory(const void *buf, size_t len, rlai_gguf **out, char *err, size_t errlen)
{
    if (!out) return set_err(err, errlen, RLAI_ERR_INVALID_ARG, "NULL output pointer");
    *out = NULL;
    if (!buf && len > 0) return set_err(err, errlen, RLAI_ERR_INVALID_ARG, "NULL buffer");
    rlai_gguf *g = calloc(1, sizeof *g);
    if (!g) return set_err(err, errlen, RLAI_ERR_NOMEM, "out of memory");
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = len;
    return open_common(g, out, err, errlen);
}

/* Frees everything owned by g and unmaps the file (if mapped). NULL ok. */
void rlai_gguf_close(rlai_gguf *g)
{
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->kvs);
    free(g->kv_index);
    free(g->tensors);
    free(g->t_index);
    free(g);
}

bool rlai_gguf_is_mapped(const rlai_gguf *g) { return g && g->mapped; }

/* ---------------------------------------------------------------- accessors
 * All accessors borrow g; returned pointers point into the mapping/buffer
 * and stay valid until rlai_gguf_close(). */

uint32_t rlai_gguf_version(const rlai_gguf *g) { return g ? g->version : 0; }
uint32_t rlai_gguf_alignment(const rlai_gguf *g) { return g ? g->alignment : 0; }
uint64_t rlai_gguf_n_kv(const rlai_gguf *g) { return g ? g->n_kv : 0; }
uint64_t rlai_gguf_n_tensors(const rlai_gguf *g) { return g ? g->n_tensors : 0; }
size_t rlai_gguf_file_size(const rlai_gguf *g) { return g ? g->size : 0; }

int64_t rlai_gguf_find_key(const rlai_gguf *g, const char *key)
{
    if (!g) return -1;
    size_t i = index_lookup(g, g->kv_index, g->kv_index_cap, kv_name, key);
    return i == SIZE_MAX ? -1 : (int64_t)i;
}

/* Key i (borrowed, not NUL-terminated); {NULL, 0} if out of range. */
rlai_gguf_str rlai_gguf_key_at(const rlai_gguf *g, uint64_t i)
{
    rlai_gguf_str none = { NULL, 0 };
    if (!g || i >= g->n_kv) return none;
    return g->kvs[i].key;
}

/* Value type of key i; UINT32_MAX if out of range. */
uint32_t rlai_gguf_vtype_at(const rlai_gguf *g, uint64_t i)
{
    if (!g || i >= g->n_kv) return UINT32_MAX;
    return g->kvs[i].vtype;
}

static const struct gguf_kv *lookup(const rlai_gguf *g, const char *key)
{
    int64_t i = rlai_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* Reads an integer value: *neg set when the value is negative (mag holds the
 * magnitude); false if vtype is not an integer type. */
static bool read_int(const struct gguf_kv *kv, bool *neg, uint64_t *mag)
{
    const uint8_t *p = kv->val;
    *neg = false;
    int64_t s;
    switch (kv->vtype) {
    case RLAI_GGUF_U8: { uint8_t v; memcpy(&v, p, 1); *mag = v; return true; }
    case RLAI_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *mag = v; return true; }
    case RLAI_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *mag = v; return true; }
    case RLAI_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); *mag = v; return true; }
    case RLAI_GGUF_I8: { int8_t v; memcpy(&v, p, 1); s = v; break; }
    case RLAI_GGUF_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case RLAI_GGUF_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case RLAI_GGUF_I64: { memcpy(&s, p, 8); break; }
    default: return false;
    }
    if (s < 0) {
        *neg = true;
        *mag = (uint64_t)0 - (uint64_t)s; /* well-defined for INT64_MIN */
    } else {
        *mag = (uint64_t)s;
    }
    return true;
}

int rlai_gguf_get_u32(const rlai_gguf *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    bool neg;
    uint64_t m;
    if (!read_int(kv, &neg, &m) || neg || m > UINT32_MAX) return RLAI_ERR_FORMAT;
    if (out) *out = (uint32_t)m;
    return 0;
}

int rlai_gguf_get_i32(const rlai_gguf *g, const char *key, int32_t *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    bool neg;
    uint64_t m;
    if (!read_int(kv, &neg, &m)) return RLAI_ERR_FORMAT;
    if (neg ? m > (uint64_t)INT32_MAX + 1 : m > (uint64_t)INT32_MAX) return RLAI_ERR_FORMAT;
    if (out) *out = neg ? (int32_t)(-(int64_t)m) : (int32_t)m;
    return 0;
}

int rlai_gguf_get_u64(const rlai_gguf *g, const char *key, uint64_t *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    bool neg;
    uint64_t m;
    if (!read_int(kv, &neg, &m) || neg) return RLAI_ERR_FORMAT;
    if (out) *out = m;
    return 0;
}

int rlai_gguf_get_f32(const rlai_gguf *g, const char *key, float *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    float f;
    if (kv->vtype == RLAI_GGUF_F32) {
        memcpy(&f, kv->val, 4);
    } else if (kv->vtype == RLAI_GGUF_F64) {
        double d;
        memcpy(&d, kv->val, 8);
        if (isfinite(d) && (d > FLT_MAX || d < -FLT_MAX))
            return RLAI_ERR_FORMAT; /* finite but out of float range */
        f = (float)d;
    } else {
        return RLAI_ERR_FORMAT;
    }
    if (out) *out = f;
    return 0;
}

int rlai_gguf_get_bool(const rlai_gguf *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    if (kv->vtype != RLAI_GGUF_BOOL) return RLAI_ERR_FORMAT;
    if (out) *out = kv->val[0] != 0;
    return 0;
}

/* *out borrows from the mapping (not NUL-terminated). */
int rlai_gguf_get_str(const rlai_gguf *g, const char *key, rlai_gguf_str *out)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    if (kv->vtype != RLAI_GGUF_STRING) return RLAI_ERR_FORMAT;
    if (out) *out = kv->str;
    return 0;
}

/* *data borrows from the mapping. */
int rlai_gguf_get_array(const rlai_gguf *g, const char *key,
                        uint32_t *elem_type, uint64_t *n, const void **data)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    if (kv->vtype != RLAI_GGUF_ARRAY) return RLAI_ERR_FORMAT;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->n;
    if (data) *data = kv->val;
    return 0;
}

/* *out is malloc'd (caller frees with free()); entries borrow the mapping. */
int rlai_gguf_get_str_array(const rlai_gguf *g, const char *key,
                            rlai_gguf_str **out, uint64_t *n)
{
    const struct gguf_kv *kv = lookup(g, key);
    if (!kv) return RLAI_ERR_NOT_FOUND;
    if (kv->vtype != RLAI_GGUF_ARRAY || kv->elem_type != RLAI_GGUF_STRING) return RLAI_ERR_FORMAT;
    /* kv->n was validated: n * 8 <= file size, so this cannot overflow. */
    size_t cnt = (size_t)kv->n;
    rlai_gguf_str *arr = malloc((cnt ? cnt : 1) * sizeof *arr);
    if (!arr) return RLAI_ERR_NOMEM;
    const uint8_t *p = kv->val;
    for (size_t i = 0; i < cnt; i++) {
        uint64_t len;
        memcpy(&len, p, 8); /* validated at open */
        arr[i].ptr = (const char *)(p + 8);
        arr[i].len = (size_t)len;
        p += 8 + (size_t)len;
    }
    if (out) *out = arr; else free(arr);
    if (n) *n = kv->n;
    return 0;
}

/* Borrowed; NULL if out of range. */
const rlai_gguf_tensor *rlai_gguf_tensor_at(const rlai_gguf *g, uint64_t i)
{
    if (!g || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

/* Borrowed; NULL if absent. O(1) average via a hash index. */
const rlai_gguf_tensor *rlai_gguf_find_tensor(const rlai_gguf *g, const char *name)
{
    if (!g) return NULL;
    size_t i = index_lookup(g, g->t_index, g->t_index_cap, t_name, name);
    return i == SIZE_MAX ? NULL : &g->tensors[i];
}

/* ggml type names (the same as engine/dtype.c's for the types it computes)
 * for the ids this reader can size (ggml.h's enum
 * ggml_type; shared/reference/llama-gguf-facts.md section 2). */
static const char *const type_names[] = {
    [0] = "f32", [1] = "f16", [2] = "q4_0", [3] = "q4_1", [6] = "q5_0", [7] = "q5_1",
    [8] = "q8_0", [9] = "q8_1", [10] = "q2_K", [11] = "q3_K", [12] = "q4_K", [13] = "q5_K",
    [14] = "q6_K", [15] = "q8_K", [16] = "iq2_xxs", [17] = "iq2_xs", [18] = "iq3_xxs",
    [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s", [22] = "iq2_s", [23] = "iq4_xs",
    [24] = "i8", [25] = "i16", [26] = "i32", [27] = "i64", [28] = "f64", [29] = "iq1_m",
    [30] = "bf16", [34] = "tq1_0", [35] = "tq2_0", [39] = "mxfp4",
};

const char *rlai_gguf_type_name(unsigned t)
{
    return t < sizeof type_names / sizeof type_names[0] ? type_names[t] : NULL;
}
