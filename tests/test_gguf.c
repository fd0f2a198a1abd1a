/* test_gguf.c - tests for the validating GGUF reader (engine/gguf.c).
 *
 * Real files: the vocab-only GGUFs under RLAI_TESTDATA/tokenizer and the
 * SmolLM2 model under RLAI_MODELS_DIR (skipped with a note if absent).
 * Synthetic files are produced by a small in-memory writer below, then
 * mutated into a table of hostile variants that must each fail cleanly with
 * the expected error code and a non-empty message.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rlai/gguf.h"
#include "rlai/engine.h"

#ifndef RLAI_TESTDATA
#define RLAI_TESTDATA "tests/data"
#endif
#ifndef RLAI_MODELS_DIR
#define RLAI_MODELS_DIR "models"
#endif

/* ------------------------------------------------------------ writer */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->len + n) nc *= 2;
        b->p = realloc(b->p, nc);
        ck_assert_ptr_nonnull(b->p);
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf *b, uint16_t v) { put(b, &v, 2); }
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(buf *b, float v) { put(b, &v, 4); }
static void put_f64(buf *b, double v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
/* key + value type */
static void put_key(buf *b, const char *k, uint32_t vt)
{
    put_str(b, k);
    put_u32(b, vt);
}
static void kv_u32(buf *b, const char *k, uint32_t v) { put_key(b, k, RLAI_GGUF_U32); put_u32(b, v); }
static void kv_str(buf *b, const char *k, const char *v) { put_key(b, k, RLAI_GGUF_STRING); put_str(b, v); }

typedef struct {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} tspec;

static void put_tensor(buf *b, const tspec *t)
{
    put_str(b, t->name);
    put_u32(b, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) put_u64(b, t->ne[d]);
    put_u32(b, t->type);
    put_u64(b, t->offset);
}

static void pad_to(buf *b, size_t align)
{
    while (b->len % align) put_u8(b, 0);
}

static void put_data(buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) put_u8(b, (uint8_t)(i * 7 + 1));
}

static void header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

/* The valid synthetic file: every value type, nested arrays, three tensors
 * (F32, Q8_0, Q4_1 with 4 dims). Tensor data ends exactly at EOF, so every
 * proper prefix is truncated. */
#define VALID_NKV 17
static const tspec valid_tensors[] = {
    { "a", 2, { 4, 2 }, 0, 0 },          /* 32 bytes */
    { "b", 1, { 32 }, 8, 32 },           /* 34 bytes */
    { "c", 4, { 64, 2, 1, 1 }, 3, 96 },  /* 2 blocks * 2 rows * 20 = 80 bytes */
};
#define VALID_DATA_BYTES (96 + 80)

static void valid_kvs(buf *b)
{
    kv_str(b, "general.architecture", "test");
    kv_u32(b, "general.alignment", 32);
    put_key(b, "t.u8", RLAI_GGUF_U8); put_u8(b, 200);
    put_key(b, "t.i8", RLAI_GGUF_I8); put_u8(b, (uint8_t)-5);
    put_key(b, "t.u16", RLAI_GGUF_U16); put_u16(b, 65000);
    put_key(b, "t.i16", RLAI_GGUF_I16); put_u16(b, (uint16_t)-300);
    kv_u32(b, "t.u32", 4000000000u);
    put_key(b, "t.i32", RLAI_GGUF_I32); put_u32(b, (uint32_t)-7);
    put_key(b, "t.f32", RLAI_GGUF_F32); put_f32(b, 1.5f);
    put_key(b, "t.bool", RLAI_GGUF_BOOL); put_u8(b, 1);
    put_key(b, "t.u64", RLAI_GGUF_U64); put_u64(b, 1ull << 40);
    put_key(b, "t.i64", RLAI_GGUF_I64); put_u64(b, (uint64_t)-1);
    put_key(b, "t.f64", RLAI_GGUF_F64); put_f64(b, 2.25);
    put_key(b, "t.arr_i32", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_I32); put_u64(b, 3);
    put_u32(b, 1); put_u32(b, 2); put_u32(b, (uint32_t)-3);
    put_key(b, "t.arr_str", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_STRING); put_u64(b, 3);
    put_str(b, "a"); put_str(b, "bc"); put_str(b, "");
    put_key(b, "t.nested", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_ARRAY); put_u64(b, 2);
    put_u32(b, RLAI_GGUF_U8); put_u64(b, 2); put_u8(b, 1); put_u8(b, 2);
    put_u32(b, RLAI_GGUF_U8); put_u64(b, 1); put_u8(b, 3);
    put_key(b, "t.arr_bool", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_BOOL); put_u64(b, 2);
    put_u8(b, 0); put_u8(b, 1);
}

static buf make_valid(void)
{
    buf b = { 0 };
    header(&b, 3, 3, VALID_NKV);
    valid_kvs(&b);
    for (int i = 0; i < 3; i++) put_tensor(&b, &valid_tensors[i]);
    pad_to(&b, 32);
    put_data(&b, VALID_DATA_BYTES);
    return b;
}

static int open_buf(const buf *b, rlai_gguf **g, char *err, size_t errlen)
{
    return rlai_gguf_open_memory(b->p, b->len, g, err, errlen);
}

/* ------------------------------------------------------------ real files */

static rlai_gguf *open_path(const char *path)
{
    char err[512] = "";
    rlai_gguf *g = NULL;
    int rc = rlai_gguf_open_file(path, &g, err, sizeof err);
    ck_assert_msg(rc == 0, "open %s: %d %s", path, rc, err);
    ck_assert_ptr_nonnull(g);
    return g;
}

static void check_str(rlai_gguf *g, const char *key, const char *want)
{
    rlai_gguf_str s;
    ck_assert_int_eq(rlai_gguf_get_str(g, key, &s), 0);
    ck_assert_uint_eq(s.len, strlen(want));
    ck_assert(memcmp(s.ptr, want, s.len) == 0);
}

static uint64_t str_array_len(rlai_gguf *g, const char *key)
{
    rlai_gguf_str *arr = NULL;
    uint64_t n = 0;
    ck_assert_int_eq(rlai_gguf_get_str_array(g, key, &arr, &n), 0);
    ck_assert_ptr_nonnull(arr);
    free(arr);
    return n;
}

START_TEST(vocab_starcoder)
{
    rlai_gguf *g = open_path(RLAI_TESTDATA "/tokenizer/ggml-vocab-starcoder.gguf");
    ck_assert_uint_eq(rlai_gguf_version(g), 3);
    ck_assert_uint_eq(rlai_gguf_n_tensors(g), 0);
    check_str(g, "tokenizer.ggml.pre", "starcoder");
    check_str(g, "tokenizer.ggml.model", "gpt2");
    ck_assert_uint_eq(str_array_len(g, "tokenizer.ggml.tokens"), 49152);
    rlai_gguf_str *toks;
    uint64_t n;
    ck_assert_int_eq(rlai_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n), 0);
    ck_assert_uint_gt(toks[0].len, 0);
    free(toks);
    rlai_gguf_close(g);
}
END_TEST

START_TEST(vocab_gpt2)
{
    rlai_gguf *g = open_path(RLAI_TESTDATA "/tokenizer/ggml-vocab-gpt-2.gguf");
    ck_assert_uint_eq(str_array_len(g, "tokenizer.ggml.tokens"), 50257);
    ck_assert_uint_eq(str_array_len(g, "tokenizer.ggml.merges"), 50000);
    uint32_t bos = 0;
    ck_assert_int_eq(rlai_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos), 0);
    ck_assert_uint_eq(bos, 50256);
    rlai_gguf_str *m;
    uint64_t n;
    ck_assert_int_eq(rlai_gguf_get_str_array(g, "tokenizer.ggml.merges", &m, &n), 0);
    ck_assert(memchr(m[0].ptr, ' ', m[0].len) != NULL); /* "A B" */
    free(m);
    /* token_type is an i32 array of the same length */
    uint32_t et;
    const void *data;
    ck_assert_int_eq(rlai_gguf_get_array(g, "tokenizer.ggml.token_type", &et, &n, &data), 0);
    ck_assert_uint_eq(et, RLAI_GGUF_I32);
    ck_assert_uint_eq(n, 50257);
    ck_assert_int_eq(rlai_gguf_get_str(g, "tokenizer.ggml.token_type", NULL), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "no.such.key", NULL), RLAI_ERR_NOT_FOUND);
    rlai_gguf_close(g);
}
END_TEST

START_TEST(vocab_llama_spm)
{
    rlai_gguf *g = open_path(RLAI_TESTDATA "/tokenizer/ggml-vocab-llama-spm.gguf");
    check_str(g, "tokenizer.ggml.model", "llama");
    uint64_t ntok = str_array_len(g, "tokenizer.ggml.tokens");
    ck_assert_uint_eq(ntok, 32000);
    uint32_t et;
    uint64_t n;
    const void *data;
    ck_assert_int_eq(rlai_gguf_get_array(g, "tokenizer.ggml.scores", &et, &n, &data), 0);
    ck_assert_uint_eq(et, RLAI_GGUF_F32);
    ck_assert_uint_eq(n, ntok);
    /* every key can be found by its own name */
    for (uint64_t i = 0; i < rlai_gguf_n_kv(g); i++) {
        rlai_gguf_str k = rlai_gguf_key_at(g, i);
        char name[256];
        ck_assert_uint_lt(k.len, sizeof name);
        memcpy(name, k.ptr, k.len);
        name[k.len] = '\0';
        ck_assert_int_eq(rlai_gguf_find_key(g, name), (int64_t)i);
    }
    rlai_gguf_close(g);
}
END_TEST

START_TEST(real_model)
{
    const char *path = RLAI_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) {
        printf("NOTE: %s not present, skipping real-model test\n", path);
        return;
    }
    rlai_gguf *g = open_path(path);
    uint32_t nl = 0;
    ck_assert_int_eq(rlai_gguf_get_u32(g, "llama.block_count", &nl), 0);
    ck_assert_uint_eq(nl, 30);
    check_str(g, "general.architecture", "llama");
    float eps = 0;
    ck_assert_int_eq(rlai_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    ck_assert(eps > 0 && eps < 1e-3f);
    ck_assert_uint_eq(rlai_gguf_n_kv(g), 33);
    ck_assert_uint_eq(rlai_gguf_n_tensors(g), 272);
    const rlai_gguf_tensor *t = rlai_gguf_find_tensor(g, "token_embd.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, 8);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_uint_eq(t->ne[0], 576);
    ck_assert_uint_eq(t->ne[1], 49152);
    ck_assert_uint_eq(t->nbytes, 576ull / 32 * 34 * 49152);
    /* every tensor is found by name, data is aligned and inside the file */
    const uint8_t *base = NULL;
    for (uint64_t i = 0; i < rlai_gguf_n_tensors(g); i++) {
        const rlai_gguf_tensor *ti = rlai_gguf_tensor_at(g, i);
        char name[80];
        memcpy(name, ti->name.ptr, ti->name.len);
        name[ti->name.len] = '\0';
        ck_assert_ptr_eq(rlai_gguf_find_tensor(g, name), ti);
        ck_assert_uint_eq((uintptr_t)ti->data % rlai_gguf_alignment(g), 0);
        if (!base || (const uint8_t *)ti->data < base) base = ti->data;
    }
    ck_assert_ptr_null(rlai_gguf_tensor_at(g, 272));
    ck_assert_ptr_null(rlai_gguf_find_tensor(g, "blk.30.attn_q.weight"));
    ck_assert_ptr_nonnull(rlai_gguf_find_tensor(g, "blk.29.ffn_down.weight"));
    rlai_gguf_close(g);
}
END_TEST

START_TEST(open_file_errors)
{
    char err[256] = "";
    rlai_gguf *g = (rlai_gguf *)1;
    ck_assert_int_eq(rlai_gguf_open_file("/nonexistent/x.gguf", &g, err, sizeof err), RLAI_ERR_IO);
    ck_assert_ptr_null(g);
    ck_assert_uint_gt(strlen(err), 0);
    ck_assert_int_eq(rlai_gguf_open_file("/", &g, err, sizeof err), RLAI_ERR_IO);
    /* a short real file */
    char tmpl[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "GGUF", 4), 4);
    close(fd);
    ck_assert_int_eq(rlai_gguf_open_file(tmpl, &g, err, sizeof err), RLAI_ERR_FORMAT);
    /* the valid synthetic file through the mmap path */
    buf b = make_valid();
    fd = open(tmpl, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, b.p, b.len), (ssize_t)b.len);
    close(fd);
    ck_assert_int_eq(rlai_gguf_open_file(tmpl, &g, err, sizeof err), 0);
    ck_assert_uint_eq(rlai_gguf_file_size(g), b.len);
    ck_assert_uint_eq(rlai_gguf_n_tensors(g), 3);
    ck_assert(memcmp(rlai_gguf_find_tensor(g, "c")->data, b.p + b.len - 80, 80) == 0);
    rlai_gguf_close(g);
    unlink(tmpl);
    free(b.p);
    rlai_gguf_close(NULL);
    /* errlen 0 must not write */
    ck_assert_int_eq(rlai_gguf_open_memory("XXXX", 4, &g, NULL, 0), RLAI_ERR_FORMAT);
}
END_TEST

/* ------------------------------------------------------------ synthetic */

START_TEST(valid_roundtrip)
{
    buf b = make_valid();
    char err[256] = "x";
    rlai_gguf *g = NULL;
    ck_assert_msg(open_buf(&b, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(err, "");
    ck_assert_uint_eq(rlai_gguf_version(g), 3);
    ck_assert_uint_eq(rlai_gguf_alignment(g), 32);
    ck_assert_uint_eq(rlai_gguf_n_kv(g), VALID_NKV);
    ck_assert_uint_eq(rlai_gguf_file_size(g), b.len);
    ck_assert_int_eq(rlai_gguf_find_key(g, "t.u8"), 2);
    ck_assert_int_eq(rlai_gguf_find_key(g, "t.u"), -1);
    ck_assert_uint_eq(rlai_gguf_vtype_at(g, 2), RLAI_GGUF_U8);
    ck_assert_uint_eq(rlai_gguf_vtype_at(g, 99), UINT32_MAX);
    ck_assert_ptr_null(rlai_gguf_key_at(g, 99).ptr);

    uint32_t u32; int32_t i32; uint64_t u64; float f; bool bo; rlai_gguf_str s;
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.u8", &u32), 0); ck_assert_uint_eq(u32, 200);
    ck_assert_int_eq(rlai_gguf_get_i32(g, "t.i8", &i32), 0); ck_assert_int_eq(i32, -5);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.i8", &u32), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.u16", &u32), 0); ck_assert_uint_eq(u32, 65000);
    ck_assert_int_eq(rlai_gguf_get_i32(g, "t.i16", &i32), 0); ck_assert_int_eq(i32, -300);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.u32", &u32), 0); ck_assert_uint_eq(u32, 4000000000u);
    ck_assert_int_eq(rlai_gguf_get_i32(g, "t.u32", &i32), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_u64(g, "t.u32", &u64), 0); ck_assert_uint_eq(u64, 4000000000u);
    ck_assert_int_eq(rlai_gguf_get_i32(g, "t.i32", &i32), 0); ck_assert_int_eq(i32, -7);
    ck_assert_int_eq(rlai_gguf_get_u64(g, "t.u64", &u64), 0); ck_assert_uint_eq(u64, 1ull << 40);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.u64", &u32), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_i32(g, "t.i64", &i32), 0); ck_assert_int_eq(i32, -1);
    ck_assert_int_eq(rlai_gguf_get_u64(g, "t.i64", &u64), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_f32(g, "t.f32", &f), 0); ck_assert(f == 1.5f);
    ck_assert_int_eq(rlai_gguf_get_f32(g, "t.f64", &f), 0); ck_assert(f == 2.25f);
    ck_assert_int_eq(rlai_gguf_get_f32(g, "t.u32", &f), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.f32", &u32), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_bool(g, "t.bool", &bo), 0); ck_assert(bo);
    ck_assert_int_eq(rlai_gguf_get_u32(g, "t.bool", &u32), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_bool(g, "t.u8", &bo), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_str(g, "general.architecture", &s), 0);
    ck_assert(s.len == 4 && memcmp(s.ptr, "test", 4) == 0);
    ck_assert_int_eq(rlai_gguf_get_str(g, "missing", &s), RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(rlai_gguf_get_bool(g, "missing", &bo), RLAI_ERR_NOT_FOUND);
    ck_assert_int_eq(rlai_gguf_get_f32(g, "missing", &f), RLAI_ERR_NOT_FOUND);

    uint32_t et; uint64_t n; const void *data;
    ck_assert_int_eq(rlai_gguf_get_array(g, "t.arr_i32", &et, &n, &data), 0);
    ck_assert_uint_eq(et, RLAI_GGUF_I32); ck_assert_uint_eq(n, 3);
    int32_t v[3];
    memcpy(v, data, sizeof v);
    ck_assert(v[0] == 1 && v[1] == 2 && v[2] == -3);
    ck_assert_int_eq(rlai_gguf_get_array(g, "t.u8", &et, &n, &data), RLAI_ERR_FORMAT);
    rlai_gguf_str *arr;
    ck_assert_int_eq(rlai_gguf_get_str_array(g, "t.arr_str", &arr, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert(arr[0].len == 1 && arr[0].ptr[0] == 'a');
    ck_assert(arr[1].len == 2 && memcmp(arr[1].ptr, "bc", 2) == 0);
    ck_assert(arr[2].len == 0);
    free(arr);
    ck_assert_int_eq(rlai_gguf_get_str_array(g, "t.arr_i32", &arr, &n), RLAI_ERR_FORMAT);
    ck_assert_int_eq(rlai_gguf_get_array(g, "t.nested", &et, &n, &data), 0);
    ck_assert_uint_eq(et, RLAI_GGUF_ARRAY); ck_assert_uint_eq(n, 2);

    ck_assert_uint_eq(rlai_gguf_n_tensors(g), 3);
    const uint8_t *blob = b.p + b.len - VALID_DATA_BYTES;
    static const uint64_t nbytes[3] = { 32, 34, 80 };
    for (int i = 0; i < 3; i++) {
        const rlai_gguf_tensor *t = rlai_gguf_find_tensor(g, valid_tensors[i].name);
        ck_assert_ptr_eq(t, rlai_gguf_tensor_at(g, (uint64_t)i));
        ck_assert_uint_eq(t->type, valid_tensors[i].type);
        ck_assert_uint_eq(t->n_dims, valid_tensors[i].n_dims);
        ck_assert_uint_eq(t->offset, valid_tensors[i].offset);
        ck_assert_uint_eq(t->nbytes, nbytes[i]);
        ck_assert_ptr_eq(t->data, blob + valid_tensors[i].offset);
        for (uint32_t d = 0; d < 4; d++)
            ck_assert_uint_eq(t->ne[d], d < t->n_dims ? valid_tensors[i].ne[d] : 1);
    }
    ck_assert_ptr_null(rlai_gguf_find_tensor(g, "d"));
    rlai_gguf_close(g);
    free(b.p);
}
END_TEST

START_TEST(valid_variants)
{
    /* v2, no tensors, no padding after the header, no alignment key. */
    buf b = { 0 };
    header(&b, 2, 0, 1);
    kv_str(&b, "general.architecture", "x");
    char err[256];
    rlai_gguf *g;
    ck_assert_msg(open_buf(&b, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(rlai_gguf_version(g), 2);
    ck_assert_uint_eq(rlai_gguf_alignment(g), 32);
    rlai_gguf_close(g);
    free(b.p);

    /* custom alignment 64, arrays nested exactly 8 deep, every known type */
    memset(&b, 0, sizeof b);
    static const uint32_t types[] = { 0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 30 };
    size_t nt = sizeof types / sizeof types[0];
    header(&b, 3, nt, 2);
    kv_u32(&b, "general.alignment", 64);
    put_key(&b, "deep", RLAI_GGUF_ARRAY);
    for (int d = 1; d < 8; d++) { put_u32(&b, RLAI_GGUF_ARRAY); put_u64(&b, 1); }
    put_u32(&b, RLAI_GGUF_U8); put_u64(&b, 1); put_u8(&b, 9);
    for (size_t i = 0; i < nt; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%zu", i);
        tspec t = { name, 2, { 256, 1 }, types[i], (uint64_t)i * 4096 };
        put_tensor(&b, &t);
    }
    pad_to(&b, 64);
    put_data(&b, nt * 4096);
    ck_assert_msg(open_buf(&b, &g, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(rlai_gguf_alignment(g), 64);
    ck_assert_uint_eq(rlai_gguf_find_tensor(g, "t8")->nbytes, 84); /* Q2_K */
    ck_assert_uint_eq(rlai_gguf_find_tensor(g, "t0")->nbytes, 1024);
    rlai_gguf_close(g);
    free(b.p);
}
END_TEST

START_TEST(truncated_prefixes)
{
    buf b = make_valid();
    char err[256];
    for (size_t n = 0; n < b.len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size so ASan sees overreads */
        memcpy(copy, b.p, n);
        rlai_gguf *g = (rlai_gguf *)1;
        err[0] = '\0';
        int rc = rlai_gguf_open_memory(copy, n, &g, err, sizeof err);
        ck_assert_msg(rc == RLAI_ERR_FORMAT, "prefix %zu: rc %d (%s)", n, rc, err);
        ck_assert_ptr_null(g);
        ck_assert_msg(strlen(err) > 0, "prefix %zu: empty message", n);
        free(copy);
    }
    free(b.p);
}
END_TEST

/* ------------------------------------------------------------ hostile table */

/* Small valid frame around one bad kv or bad tensor list. */
static buf one_kv(void (*kv)(buf *))
{
    buf b = { 0 };
    header(&b, 3, 0, 1);
    kv(&b);
    return b;
}

static buf tensors(const tspec *ts, size_t n, size_t data_bytes)
{
    buf b = { 0 };
    header(&b, 3, n, 1);
    kv_str(&b, "general.architecture", "x");
    for (size_t i = 0; i < n; i++) put_tensor(&b, &ts[i]);
    pad_to(&b, 32);
    put_data(&b, data_bytes);
    return b;
}

static buf h_bad_magic(void) { buf b = make_valid(); b.p[0] = 'X'; return b; }
static buf h_version(uint32_t v) { buf b = make_valid(); memcpy(b.p + 4, &v, 4); return b; }
static buf h_version1(void) { return h_version(1); }
static buf h_version4(void) { return h_version(4); }
static buf h_version_be(void) { return h_version(0x03000000u); }
static buf h_version0(void) { return h_version(0); }
static buf h_empty(void) { buf b = { 0 }; return b; }
static buf h_huge_tensor_count(void) { buf b = make_valid(); uint64_t v = 1ull << 60; memcpy(b.p + 8, &v, 8); return b; }
static buf h_huge_kv_count(void) { buf b = make_valid(); uint64_t v = UINT64_MAX; memcpy(b.p + 16, &v, 8); return b; }
static buf h_kv_count_plus1(void) { buf b = make_valid(); uint64_t v = VALID_NKV + 1; memcpy(b.p + 16, &v, 8); return b; }
static void k_huge_strlen(buf *b) { put_u64(b, 1234567); put(b, "abcdefghijklmnopqrstuvwxyz", 26); }
static buf h_huge_strlen(void) { return one_kv(k_huge_strlen); }
static void k_strlen_max(buf *b) { put_u64(b, UINT64_MAX); put(b, "abcdefgh", 8); }
static buf h_strlen_max(void) { return one_kv(k_strlen_max); }
static void k_long_key(buf *b)
{
    char *k = malloc(70001);
    memset(k, 'k', 70000);
    k[70000] = '\0';
    kv_u32(b, k, 1);
    free(k);
}
static buf h_long_key(void) { return one_kv(k_long_key); }
static void k_unknown_vtype(buf *b) { put_key(b, "a", 13); put_u32(b, 0); }
static buf h_unknown_vtype(void) { return one_kv(k_unknown_vtype); }
static void k_vtype_max(buf *b) { put_key(b, "a", UINT32_MAX); put_u32(b, 0); }
static buf h_vtype_max(void) { return one_kv(k_vtype_max); }
static void k_huge_array(buf *b) { put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_U32); put_u64(b, 1ull << 62); put_u32(b, 1); }
static buf h_huge_array(void) { return one_kv(k_huge_array); }
static void k_huge_array64(buf *b) { put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_F64); put_u64(b, (UINT64_MAX / 8) + 2); put_u64(b, 1); }
static buf h_huge_array64(void) { return one_kv(k_huge_array64); }
static void k_array_unknown_elem(buf *b) { put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, 77); put_u64(b, 0); }
static buf h_array_unknown_elem(void) { return one_kv(k_array_unknown_elem); }
static void k_deep(buf *b)
{
    put_key(b, "a", RLAI_GGUF_ARRAY);
    for (int d = 1; d < 9; d++) { put_u32(b, RLAI_GGUF_ARRAY); put_u64(b, 1); }
    put_u32(b, RLAI_GGUF_U8); put_u64(b, 1); put_u8(b, 9);
}
static buf h_deep(void) { return one_kv(k_deep); }
static void k_nested_huge(buf *b)
{
    put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_ARRAY); put_u64(b, 1);
    put_u32(b, RLAI_GGUF_STRING); put_u64(b, 1ull << 61); put_u64(b, 0);
}
static buf h_nested_huge(void) { return one_kv(k_nested_huge); }
static void k_arr_str_huge(buf *b)
{
    put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_STRING); put_u64(b, 2);
    put_str(b, "ok"); put_u64(b, 99999); put(b, "xy", 2);
}
static buf h_arr_str_huge(void) { return one_kv(k_arr_str_huge); }
static void k_bool2(buf *b) { put_key(b, "a", RLAI_GGUF_BOOL); put_u8(b, 2); }
static buf h_bool2(void) { return one_kv(k_bool2); }
static void k_bool_arr2(buf *b) { put_key(b, "a", RLAI_GGUF_ARRAY); put_u32(b, RLAI_GGUF_BOOL); put_u64(b, 2); put_u8(b, 1); put_u8(b, 255); }
static buf h_bool_arr2(void) { return one_kv(k_bool_arr2); }
static void k_align0(buf *b) { kv_u32(b, "general.alignment", 0); }
static buf h_align0(void) { return one_kv(k_align0); }
static void k_align3(buf *b) { kv_u32(b, "general.alignment", 3); }
static buf h_align3(void) { return one_kv(k_align3); }
static void k_align_u64(buf *b) { put_key(b, "general.alignment", RLAI_GGUF_U64); put_u64(b, 32); }
static buf h_align_u64(void) { return one_kv(k_align_u64); }
static void k_align_str(buf *b) { kv_str(b, "general.alignment", "32"); }
static buf h_align_str(void) { return one_kv(k_align_str); }
static buf h_dup_key(void)
{
    buf b = { 0 };
    header(&b, 3, 0, 3);
    kv_u32(&b, "a.b", 1);
    kv_u32(&b, "c", 2);
    kv_str(&b, "a.b", "again");
    return b;
}

static buf h_dup_tensor(void)
{
    tspec t[2] = { { "w", 1, { 8 }, 0, 0 }, { "w", 1, { 8 }, 0, 32 } };
    return tensors(t, 2, 64);
}
static buf h_ndims0(void) { tspec t = { "w", 0, { 0 }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_ndims5(void)
{
    buf b = { 0 };
    header(&b, 3, 1, 0);
    put_str(&b, "w"); put_u32(&b, 5);
    for (int i = 0; i < 5; i++) put_u64(&b, 1);
    put_u32(&b, 0); put_u64(&b, 0);
    pad_to(&b, 32);
    put_data(&b, 64);
    return b;
}
static buf h_ne_block(void) { tspec t = { "w", 2, { 33, 1 }, 8, 0 }; return tensors(&t, 1, 64); }
static buf h_ne_kblock(void) { tspec t = { "w", 1, { 128 }, 12, 0 }; return tensors(&t, 1, 256); }
static buf h_ne_zero(void) { tspec t = { "w", 2, { 8, 0 }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_ne_overflow(void) { tspec t = { "w", 2, { 1ull << 32, 1ull << 32 }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_ne_neg(void) { tspec t = { "w", 1, { UINT64_MAX }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_nbytes_overflow(void) { tspec t = { "w", 1, { 1ull << 62 }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_unknown_type(void) { tspec t = { "blk.0.attn_q.weight", 1, { 8 }, 99, 0 }; return tensors(&t, 1, 64); }
static buf h_removed_type(void) { tspec t = { "w", 1, { 32 }, 31, 0 }; return tensors(&t, 1, 64); }
static buf h_unaligned(void) { tspec t = { "w", 1, { 8 }, 0, 4 }; return tensors(&t, 1, 64); }
static buf h_past_eof(void) { tspec t = { "w", 1, { 32 }, 0, 0 }; return tensors(&t, 1, 127); }
static buf h_offset_past_eof(void) { tspec t = { "w", 1, { 1 }, 0, 1ull << 40 }; return tensors(&t, 1, 64); }
static buf h_overlap(void)
{
    tspec t[2] = { { "a", 1, { 16 }, 0, 0 }, { "b", 1, { 8 }, 0, 32 } }; /* a is 64 bytes */
    return tensors(t, 2, 128);
}
static buf h_overlap_same(void)
{
    tspec t[2] = { { "a", 1, { 8 }, 0, 32 }, { "b", 1, { 8 }, 0, 32 } };
    return tensors(t, 2, 128);
}
static buf h_offset_overflow(void)
{
    tspec t = { "w", 1, { 64 }, 0, UINT64_MAX - 31 }; /* aligned, offset+size wraps */
    return tensors(&t, 1, 64);
}
static buf h_long_name(void)
{
    char name[66];
    memset(name, 'n', 65);
    name[65] = '\0';
    tspec t = { name, 1, { 8 }, 0, 0 };
    return tensors(&t, 1, 64);
}
static buf h_empty_name(void) { tspec t = { "", 1, { 8 }, 0, 0 }; return tensors(&t, 1, 64); }
static buf h_tensor_strlen(void)
{
    buf b = { 0 };
    header(&b, 3, 1, 0);
    put_u64(&b, 1ull << 50);
    put_data(&b, 40);
    return b;
}
static buf h_data_start_past_eof(void)
{
    buf b = tensors(&(tspec){ "w", 1, { 8 }, 0, 0 }, 1, 0);
    while (b.len % 32 == 0) b.len--; /* cut the padding */
    return b;
}

typedef struct {
    const char *name;
    buf (*make)(void);
    int want;
    const char *msg_part; /* substring the message must contain, or NULL */
} hostile;

static const hostile cases[] = {
    { "bad magic", h_bad_magic, RLAI_ERR_FORMAT, "magic" },
    { "empty buffer", h_empty, RLAI_ERR_FORMAT, NULL },
    { "version 0", h_version0, RLAI_ERR_UNSUPPORTED, "version 0" },
    { "version 1", h_version1, RLAI_ERR_UNSUPPORTED, "version 1" },
    { "version 4", h_version4, RLAI_ERR_UNSUPPORTED, "version 4" },
    { "big-endian version", h_version_be, RLAI_ERR_UNSUPPORTED, "big-endian" },
    { "huge tensor_count", h_huge_tensor_count, RLAI_ERR_FORMAT, "tensor_count" },
    { "huge kv_count", h_huge_kv_count, RLAI_ERR_FORMAT, "kv_count" },
    { "kv_count one too many", h_kv_count_plus1, RLAI_ERR_FORMAT, NULL },
    { "huge string length", h_huge_strlen, RLAI_ERR_FORMAT, "1234567" },
    { "string length UINT64_MAX", h_strlen_max, RLAI_ERR_FORMAT, "exceeds remaining" },
    { "key length > 65535", h_long_key, RLAI_ERR_FORMAT, "65535" },
    { "unknown value type", h_unknown_vtype, RLAI_ERR_FORMAT, "value type 13" },
    { "value type UINT32_MAX", h_vtype_max, RLAI_ERR_FORMAT, "unknown" },
    { "array of huge count", h_huge_array, RLAI_ERR_FORMAT, "array" },
    { "f64 array count*8 overflows", h_huge_array64, RLAI_ERR_FORMAT, "array" },
    { "array unknown element type", h_array_unknown_elem, RLAI_ERR_FORMAT, "element type 77" },
    { "arrays nested 9 deep", h_deep, RLAI_ERR_FORMAT, "nested" },
    { "nested array huge count", h_nested_huge, RLAI_ERR_FORMAT, NULL },
    { "string array element too long", h_arr_str_huge, RLAI_ERR_FORMAT, "element 1" },
    { "bool value 2", h_bool2, RLAI_ERR_FORMAT, "bool" },
    { "bool array value 255", h_bool_arr2, RLAI_ERR_FORMAT, "bool" },
    { "alignment 0", h_align0, RLAI_ERR_FORMAT, "alignment" },
    { "alignment 3", h_align3, RLAI_ERR_FORMAT, "alignment" },
    { "alignment u64", h_align_u64, RLAI_ERR_FORMAT, "u32" },
    { "alignment string", h_align_str, RLAI_ERR_FORMAT, "u32" },
    { "duplicate key", h_dup_key, RLAI_ERR_FORMAT, "a.b" },
    { "duplicate tensor name", h_dup_tensor, RLAI_ERR_FORMAT, "duplicate tensor" },
    { "n_dims 0", h_ndims0, RLAI_ERR_FORMAT, "n_dims" },
    { "n_dims 5", h_ndims5, RLAI_ERR_FORMAT, "n_dims" },
    { "ne[0] not multiple of 32", h_ne_block, RLAI_ERR_FORMAT, "block size" },
    { "ne[0] not multiple of 256", h_ne_kblock, RLAI_ERR_FORMAT, "block size" },
    { "ne == 0", h_ne_zero, RLAI_ERR_FORMAT, "ne[1]" },
    { "ne product overflow", h_ne_overflow, RLAI_ERR_FORMAT, "overflow" },
    { "ne > INT64_MAX", h_ne_neg, RLAI_ERR_FORMAT, "ne[0]" },
    { "nbytes overflow", h_nbytes_overflow, RLAI_ERR_FORMAT, "overflow" },
    { "unknown tensor type", h_unknown_type, RLAI_ERR_UNSUPPORTED, "'blk.0.attn_q.weight': type 99" },
    { "removed tensor type 31", h_removed_type, RLAI_ERR_UNSUPPORTED, "type 31" },
    { "offset not aligned", h_unaligned, RLAI_ERR_FORMAT, "alignment" },
    { "data past EOF", h_past_eof, RLAI_ERR_FORMAT, "end of file" },
    { "offset past EOF", h_offset_past_eof, RLAI_ERR_FORMAT, "end of file" },
    { "overlapping tensors", h_overlap, RLAI_ERR_FORMAT, "overlap" },
    { "identical offsets", h_overlap_same, RLAI_ERR_FORMAT, "overlap" },
    { "offset+size overflow", h_offset_overflow, RLAI_ERR_FORMAT, "end of file" },
    { "tensor name > 64", h_long_name, RLAI_ERR_FORMAT, "name length 65" },
    { "empty tensor name", h_empty_name, RLAI_ERR_FORMAT, "empty name" },
    { "tensor name length huge", h_tensor_strlen, RLAI_ERR_FORMAT, "tensor info #0" },
    { "data blob starts past EOF", h_data_start_past_eof, RLAI_ERR_FORMAT, NULL },
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(hostile_case)
{
    const hostile *c = &cases[_i];
    buf b = c->make();
    /* copy into an exact-size allocation so ASan catches any overread */
    uint8_t *copy = malloc(b.len ? b.len : 1);
    if (b.len) memcpy(copy, b.p, b.len);
    char err[512] = "";
    rlai_gguf *g = (rlai_gguf *)1;
    int rc = rlai_gguf_open_memory(copy, b.len, &g, err, sizeof err);
    ck_assert_msg(rc == c->want, "%s: got %d (%s), want %d", c->name, rc, err, c->want);
    ck_assert_ptr_null(g);
    ck_assert_msg(strlen(err) > 0, "%s: empty message", c->name);
    ck_assert_msg(strncmp(err, "gguf: ", 6) == 0, "%s: message '%s'", c->name, err);
    if (c->msg_part)
        ck_assert_msg(strstr(err, c->msg_part) != NULL, "%s: message '%s' lacks '%s'",
                      c->name, err, c->msg_part);
    /* a tiny error buffer truncates but stays NUL-terminated */
    char small[8];
    memset(small, 'z', sizeof small);
    rc = rlai_gguf_open_memory(copy, b.len, &g, small, sizeof small);
    ck_assert_int_eq(rc, c->want);
    ck_assert(memchr(small, '\0', sizeof small) != NULL);
    free(copy);
    free(b.p);
}
END_TEST

static Suite *gguf_suite(void)
{
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("real");
    tcase_add_test(tc, vocab_starcoder);
    tcase_add_test(tc, vocab_gpt2);
    tcase_add_test(tc, vocab_llama_spm);
    tcase_add_test(tc, real_model);
    tcase_add_test(tc, open_file_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("synthetic");
    tcase_add_test(tc, valid_roundtrip);
    tcase_add_test(tc, valid_variants);
    tcase_add_test(tc, truncated_prefixes);
    tcase_add_loop_test(tc, hostile_case, 0, N_CASES);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(gguf_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
